// Reader of per-rank FSDP checkpoint files (docs/formats.md §3): every rank
// torch.save'd its own sharded state dict (ShardedTensor or DTensor values,
// plain tensors such as the optimizer `step`, plain values such as
// param_groups). The files of one family (names that differ only in the
// rank, see rank_file_names.h) are read with torch_pt::read_pt_file and
// merged into one CheckpointModel:
//
//   - a sharded value becomes one TensorEntry whose chunks are every rank's
//     local shards at their global offsets (global shape and dtype must
//     agree); HSDP replicas (DTensor Replicate placements) keep the chunks of
//     the lowest rank holding each box;
//   - a plain tensor is taken from rank 0 and must be bytewise equal on every
//     rank; any other value must be equal on every rank;
//   - the rank in each file's content (ShardedTensor placements, DTensor mesh
//     rank) must match the rank in its name, and the ranks must be exactly
//     0..N-1 of one world size (from the content, else the names).
//
// One family gives its state dict as it is (model or optimizer). A model and
// an optimizer family side by side give {"model": ..., "optim": ...}; `only`
// ("model" / "optim") reads just that family and gives its state dict alone.
// FSDP1 flat-parameter files (LOCAL_STATE_DICT model files, raw
// optim.state_dict() files: formats/fsdp_flat/flat_params.h) are unflattened
// with `param_layout` (--param-layout FILE) into the full state dicts; without
// it they are refused (Unimplemented) saying what is missing.
#pragma once

#include <string>
#include <vector>

#include <functional>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::fsdp_ranks {

// SRC is a directory (every per-rank file in it) or a glob pattern.
// `sink` (validate): every record's CRC-32 is verified, and each problem the
// reader can continue past (an unreadable file, a rank missing, duplicated
// or of another world size, values that differ between ranks) is reported
// there instead of thrown; the model holds what could be merged.
// `param_layout` names the --param-layout checkpoint; `param_layout_model`
// reads it (ReadOptions::param_layout_model), called only for flat parameters.
CheckpointModel read_fsdp_ranks(const std::string& src, const std::string& only = "", ProblemSink* sink = nullptr,
                                const std::string& param_layout = "",
                                const std::function<CheckpointModel()>& param_layout_model = {});
// Files given one by one; `source` names them in messages.
CheckpointModel read_fsdp_rank_files(const std::vector<std::string>& files, const std::string& source,
                                     const std::string& only = "", ProblemSink* sink = nullptr,
                                     const std::string& param_layout = "",
                                     const std::function<CheckpointModel()>& param_layout_model = {});

}  // namespace ckpt::fsdp_ranks
