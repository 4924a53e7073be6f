// ShardedTensor and DTensor values inside per-rank torch.save files
// (docs/formats.md §3). Both pickle as
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

// ---- writing (reshard to per-rank files) ----
//
// The values below are the trees torch 2.15 pickles for FSDP1
// SHARDED_STATE_DICT on CPU (the bytes of testdata/fsdp_st and fsdp_dt),
// built for rank `rank` of a world of `world_size`: dim 0 split as
// torch.chunk splits it. `local` is the reference (make_tensor_ref) of this
// rank's contiguous piece, as write_pt stores tensors.

// ShardedTensor as FSDP1's _create_chunk_sharded_tensor makes it: one shard
// per non-empty torch.chunk piece, placed "rank:<r>/cpu"; a rank whose piece
// is empty has no local shard (`local` is then unused). Loading it needs a
// process group of `world_size` in which this is rank `rank`.
pickle::ValuePtr make_sharded_tensor(DType dtype, const Shape& shape, int rank, int world_size,
                                     const pickle::ValuePtr& local);

// What a loading job compares its own DeviceMesh with (DeviceMesh.__eq__):
// a DTensor whose mesh differs in device type or dimension names cannot be
// redistributed onto the job's mesh ("cross mesh"). FSDP1 on GPUs saves
// "cuda"; veRL names its dimension "fsdp".
using MeshInfo = DeviceMeshInfo;

// The first DeviceMesh in the torch.save archive `source` (a per-rank file
// with DTensor values); nullopt when it has none.
std::optional<MeshInfo> find_device_mesh(const SourcePtr& source);

// The 1-D DeviceMesh over ranks 0..world_size-1 that every DTensor of one
// file shares (its process group is the default one, group name "0").
// `rank_map` references an int32 tensor holding 0..world_size-1 (the mesh).
// Cached hashes are written as None: torch recomputes them on first use
// (they depend on the process's string hash seed anyway).
pickle::ValuePtr make_device_mesh(int rank, int world_size, const pickle::ValuePtr& rank_map, const MeshInfo& info);

// DTensor with placements (Shard(0),) on `mesh`; every rank has a local
// tensor, empty on ranks past the last torch.chunk piece.
pickle::ValuePtr make_dtensor(DType dtype, const Shape& shape, const pickle::ValuePtr& mesh,
                              const pickle::ValuePtr& local);

}  // namespace ckpt::torch_pt
