// inspect: what a checkpoint holds, without loading tensor data.
#pragma once

#include <ostream>

#include "jobs/common.h"

namespace ckpt::jobs {

struct InspectRequest {
  CommonOptions common;  // source, files, tag, only, keys
  bool json = false;     // docs/inspect-json.md
  bool tags = false;     // only the names of the checkpoints SRC holds, one per line (shell completion of --tag)
};

JobReport run_inspect(const InspectRequest& request, std::ostream& out);

}  // namespace ckpt::jobs
