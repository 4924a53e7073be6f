// CheckpointModel: what a reader knows about a checkpoint without loading
// tensor data. The structure (nested dicts, lists, plain values) is a pickle
// value tree in which each tensor is a reference into `tensors`; each tensor
// has a dtype, a global shape and the chunks that hold its bytes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/byte_source.h"
#include "model/source_info.h"
#include "pickle/value.h"

namespace ckpt {

using Shape = std::vector<int64_t>;

// Number of elements; DataLoss on negative extents or overflow.
uint64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "(7, 8)"
// The one notation for a box of a tensor, as Python slices: "[3:6, 0:8]";
// "[]" for a 0-dim tensor.
std::string box_str(const Shape& offsets, const Shape& sizes);
// Row-major strides of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);

// One piece of a tensor: the box [offsets, offsets+sizes) of the global
// tensor, read from `storage` (element i of the box at storage element
// storage_offset + sum(idx_d * strides_d)).
struct TensorChunk {
  Shape offsets;
  Shape sizes;
  SourcePtr storage;                    // the storage's bytes (a zip record)
  int64_t storage_offset = 0;           // in elements
  Shape strides;                        // in elements
  std::optional<uint32_t> storage_crc;  // CRC-32 of the whole storage record, when the source recorded it
  std::string file;                     // the file holding it, for messages
  int rank = -1;                        // the rank that wrote it, when known
  std::string record;                   // the storage record's name in its archive, for messages
  bool big_endian = false;              // elements stored big-endian (torch.save byteorder 'big'): swapped when copied

  uint64_t numel() const { return shape_numel(sizes); }
  // True when the chunk's bytes are the whole storage, contiguous and in order.
  bool is_whole_contiguous_storage(std::size_t itemsize) const;
};

struct TensorEntry {
  std::string name;  // dotted path, for messages and --keys
  DType dtype = DType::kFloat32;
  Shape shape;  // global
  std::vector<TensorChunk> chunks;
  bool requires_grad = false;
  // A parameter the job did not train, where the source records it
  // (SourceInfo::records_frozen): --exclude-frozen leaves it out.
  bool frozen = false;
  StorageKind storage = StorageKind::kTensor;
  std::optional<DType> out_dtype;  // set by --dtype: the dtype to write
  std::string sharding;            // how a sharded value described itself, for inspect
  int world_size = -1;             // sharded values: ranks in the process group / device mesh that wrote it

  uint64_t numel() const { return shape_numel(shape); }
  // A ShardedTensor or DTensor value: each rank held a piece.
  bool is_sharded() const { return storage == StorageKind::kShardedTensor || storage == StorageKind::kDTensor; }
  uint64_t nbytes() const { return numel() * dtype_size(dtype); }
  DType output_dtype() const { return out_dtype.value_or(dtype); }
  uint64_t output_nbytes() const { return numel() * dtype_size(output_dtype()); }
};

struct CheckpointModel {
  SourceInfo info;        // what the reader learned about the source itself
  std::string source;     // the path given by the user
  pickle::ValuePtr root;  // structure; tensors are tensor references
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> facts;  // for display only (inspect): e.g. "dcp_metadata_version" -> "1.0.0"

  // "pt", "dcp", "fsdp-ranks", "safetensors", "hdf5" (reports, JSON, manifests).
  const char* format() const { return source_format_name(info.kind); }
};

// The placeholder for tensor `index` inside CheckpointModel::root. It is a
// kCall of the global ("ckptconv", "tensor"), a name no pickle may carry
// (the policy refuses it), so it cannot be confused with real content.
pickle::ValuePtr make_tensor_ref(std::size_t index);
// Drops tensors that `root` no longer references (e.g. the local tensors a
// ShardedTensor was decoded from) and renumbers the references in place,
// the first kept tensor becoming index `first_index`.
void prune_unreferenced(const pickle::ValuePtr& root, std::vector<TensorEntry>& tensors, std::size_t first_index = 0);
std::optional<std::size_t> tensor_ref_index(const pickle::Value& value);
// Moves `part`'s tensors to the end of `into`'s and returns `part`'s root,
// its references renumbered to match: how one model is built from the
// models of several files (Accelerate's two DCP directories, Lightning's
// meta.pt beside its DCP items).
pickle::ValuePtr adopt(CheckpointModel& into, CheckpointModel part);

}  // namespace ckpt
