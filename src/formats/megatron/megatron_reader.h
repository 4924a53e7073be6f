// Reader of Megatron-core `torch_dist` checkpoints (docs/megatron.md): a DCP
// directory written by megatron-core's dist_checkpointing, plus
// metadata.json ({"sharded_backend": "torch_dist", ...}) and common.pt (the
// state that is not sharded: iteration, the optimizer's param_groups, a
// Megatron-LM job's args).
//
// Three views of the same files, chosen by --only:
//   (none)  the stored tensors whole, under their stored keys (transformer
//           layers stacked on a leading axis: decoder.layers.<param> is
//           [num_layers, ...]), as torch's dcp_to_torch_save gives them;
//           sharded objects (KEY/shard_<offsets>_<shape> byte items)
//           grouped back under KEY as a list; common.pt's entries added
//           at the top level.
//   model   the model's tensors and _extra_state objects, layers unstacked:
//           decoder.layers.<i>.<param> with the global layer index, the
//           names a TP=1/PP=1 model's sharded_state_dict keys give.
//   optim   {"state": {name: {exp_avg, exp_avg_sq, param, ...}},
//           "param_groups": [...]} from a `fully_reshardable` distributed
//           optimizer (optimizer.state.<kind>.<model key>), names as for
//           model. A `dp_reshardable` one stores flat per-bucket buffers
//           whose mapping to parameters is not in the checkpoint: refused,
//           saying so.
#pragma once

#include <string>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::megatron {

// A directory whose metadata.json names a sharded backend (megatron-core's
// dist_checkpointing writes it for every backend).
bool is_dist_checkpoint(const std::string& dir);

// `problems` (validate): problems the reader can read past are reported
// there (an object's missing shards, items that do not decode).
CheckpointModel read_torch_dist(const std::string& dir, ProblemSink* problems, const std::string& only);

}  // namespace ckpt::megatron
