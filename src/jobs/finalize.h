// `ckptconv finalize OUT`: completes a --part output whose workers all
// finished but whose finalizing step did not (its process died, or the
// disk filled while it published). The workers keep their request beside
// the parts (OUT.parts-<plan>/request.json, written by request_json); this
// job reruns that request's finalizing step (--part finalize), in the
// directory the workers ran in, so it needs no SRC.
#pragma once

#include <ostream>
#include <string>

#include "jobs/consolidate.h"
#include "jobs/reshard.h"

namespace ckpt::jobs {

struct FinalizeRequest {
  std::string output;     // OUT, as the workers' -o names it
  bool force = false;     // replace an existing OUT (the workers' --force counts too)
  bool no_fsync = false;  // or theirs
};

JobReport run_finalize(const FinalizeRequest& request, std::ostream& out);

// The request as the parts folder keeps it: the command, the directory it
// ran in, and every option that shapes the output.
std::string request_json(const ConsolidateRequest& request);
std::string request_json(const ReshardRequest& request);

}  // namespace ckpt::jobs
