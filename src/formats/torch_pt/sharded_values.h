// ShardedTensor and DTensor values inside per-rank torch.save files
// (FORMATS.md §3). Both pickle as
//   torch._tensor._rebuild_from_type_v2(_rebuild_wrapper_subclass, <class>,
//       (<class>, dtype, global size, stride, storage_offset, layout, device, requires_grad),
//       state)
// ShardedTensor state: (local_shards: [Shard(tensor, ShardMetadata(shard_offsets,
//   shard_sizes, placement=_remote_device(_rank))], ShardedTensorMetadata(
//   shards_metadata, size, tensor_properties), ProcessGroupState, spec, init_rrefs)
// DTensor state: (None, {_local_tensor, _spec: DTensorSpec(mesh: DeviceMesh(...,
//   _coordinate_on_dim), placements: (Shard(dim) | Replicate ...), tensor_meta:
//   TensorMeta(shape, stride, dtype))})
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt::torch_pt {

// `call` is the _rebuild_from_type_v2 call with its arguments already
// decoded (local tensors are references into `tensors`); `type` is the class.
// Returns the global tensor with this file's chunks placed at their global
// offsets, or nullopt when the class is not a known sharded type.
std::optional<TensorEntry> decode_sharded_value(const pickle::Value& call, const pickle::Value& type,
                                                const std::string& path, const std::vector<TensorEntry>& tensors);

// Global offset and extent of the `coord`-th of `n` torch.chunk pieces of a
// dimension of `size` elements (FSDP and DTensor Shard placement).
std::pair<int64_t, int64_t> chunk_piece(int64_t size, int64_t n, int64_t coord);

}  // namespace ckpt::torch_pt
