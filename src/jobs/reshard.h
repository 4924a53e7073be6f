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

namespace ckpt::jobs {

struct ReshardRequest {
  CommonOptions common;
  std::string output;
  // --world-size; absent only where the layout needs none (deepspeed-universal loads at any)
  std::optional<int> world_size;
  // dcp | hf | fsdp-sharded-tensor | fsdp-dtensor | accelerate | deepspeed-universal; empty: the source's own
  std::string layout;
  std::string mesh_device;                  // DTensor layout: the mesh's device type; empty: the source's, else cpu
  std::vector<std::string> mesh_dim_names;  // and its dimension name (veRL: fsdp); empty: the source's, else none
  std::string part;                         // --part I/N|auto|finalize: this process's share (exec/parted_output.h)
  // --update-latest: a deepspeed-universal output replaces an existing
  // latest_universal beside it (which the job may have read its source
  // through); without it an existing pointer is kept and only a missing one written.
  bool update_latest = false;
};

// --dry-run prints, per output rank, its files and exact sizes to `out`.
JobReport run_reshard(const ReshardRequest& request, std::ostream& out);

}  // namespace ckpt::jobs
