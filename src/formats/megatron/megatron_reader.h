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

#include <cstddef>
#include <optional>
#include <string>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::megatron {

// A directory whose metadata.json names a sharded backend (megatron-core's
// dist_checkpointing writes it for every backend).
bool is_dist_checkpoint(const std::string& dir);

// A sharded object's stored item: KEY/shard_<offsets>_<global shape>, each
// a dot-joined list of integers (mapping.py ShardedObject.unique_key).
struct ObjectShard {
  std::string key;
  Shape offsets;
  Shape shape;
};
// megatron-core shards objects over at most 3 axes (TP, PP, DP/EP); an
// object's value nests one list per axis, so a claimed rank of thousands
// would build a tree deeper than any reader (this one included) takes.
inline constexpr std::size_t kMaxObjectRank = 8;

// An item's key as a sharded object's; nullopt when it is no object key,
// DataLoss when it claims one it cannot be (offsets outside the shape, a
// rank above kMaxObjectRank, a number of more than 12 digits). Linear in
// the key's length.
std::optional<ObjectShard> parse_object_key(const std::string& item);

// `problems` (validate): problems the reader can read past are reported
// there (an object's missing shards, items that do not decode).
CheckpointModel read_torch_dist(const std::string& dir, ProblemSink* problems, const std::string& only);

}  // namespace ckpt::megatron
