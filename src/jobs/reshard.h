// reshard: rewrite a checkpoint for N ranks, offline, so that training
// resumes at a new world size with its usual loading code: a DCP directory in
// the FSDP2 layout, or N per-rank files as FSDP1 saves them under
// SHARDED_STATE_DICT (ShardedTensor or DTensor values). SRC is a DCP
// directory, per-rank files, or a full state dict (scattered without a
// process group).
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "jobs/common.h"
#include "jobs/requests.h"

namespace ckpt::jobs {

// --dry-run prints, per output rank, its files and exact sizes to `out`.
JobReport run_reshard(const ReshardRequest& request, std::ostream& out);

}  // namespace ckpt::jobs
