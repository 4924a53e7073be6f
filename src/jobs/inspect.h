// inspect: what a checkpoint holds, without loading tensor data.
#pragma once

#include <ostream>

#include "jobs/common.h"

namespace ckpt::jobs {

struct InspectRequest {
  CommonOptions common;  // source, files
  bool json = false;     // docs/inspect-json.md
};

JobReport run_inspect(const InspectRequest& request, std::ostream& out);

}  // namespace ckpt::jobs
