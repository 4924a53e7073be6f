// `ckptconv finalize OUT`: completes a --part output whose workers all
// finished but whose finalizing step did not (its process died, or the
// disk filled while it published). The workers keep their request beside
// the parts (OUT.parts-<plan>/request.json, written by request_json, jobs/requests.h); this
// job reruns that request's finalizing step (--part finalize), in the
// directory the workers ran in, so it needs no SRC.
#pragma once

#include <ostream>
#include <string>

#include "jobs/common.h"

namespace ckpt::jobs {

struct FinalizeRequest {
  std::string output;     // OUT, as the workers' -o names it
  bool force = false;     // replace an existing OUT (the workers' --force counts too)
  bool no_fsync = false;  // or theirs
};

JobReport run_finalize(const FinalizeRequest& request, std::ostream& out);

}  // namespace ckpt::jobs
