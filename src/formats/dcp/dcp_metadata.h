// The `.metadata` file of a torch.distributed.checkpoint directory
// (docs/formats.md §2): a pickle (protocol 4/5) of
//
//   Metadata(state_dict_metadata: {fqn: TensorStorageMetadata | BytesStorageMetadata},
//            planner_data: {fqn: (path elements...)},
//            storage_data: {MetadataIndex(fqn, offset, index): _StorageInfo(relative_path, offset, length[,
//            transform_descriptors])}, storage_meta: StorageMeta (>= 2.4), version: "1.0.0" (newest))
//
//   TensorStorageMetadata(properties: TensorProperties, size: torch.Size,
//                         chunks: [ChunkStorageMetadata(offsets: Size, sizes: Size)])
//   TensorProperties pickles its state as a tuple (dtype, layout, requires_grad,
//   memory_format, pin_memory, ...); older ones as a dict.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/problems.h"
#include "model/checkpoint_model.h"
#include "pickle/value.h"

namespace ckpt::dcp {

struct ChunkMeta {
  Shape offsets;
  Shape sizes;
};

struct ItemMeta {
  std::string fqn;
  bool is_tensor = false;
  DType dtype = DType::kFloat32;
  Shape size;
  std::vector<ChunkMeta> chunks;
};

struct StorageInfo {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::string> transforms;  // e.g. "stream.zstd/1"
};

struct DcpMetadata {
  std::vector<ItemMeta> items;                                        // state_dict_metadata order
  std::map<std::string, std::vector<pickle::ValuePtr>> planner_data;  // fqn -> path elements (str or int)
  std::vector<std::string> planner_order;  // planner_data keys in file order: the saved state dict's order
  // (fqn, chunk offsets) -> storage; bytes items use empty offsets.
  std::map<std::pair<std::string, Shape>, StorageInfo> storage;
  std::string version;  // "" before torch 2.4
  bool has_storage_meta = false;
};

// Interprets the unpickled `.metadata` object. DataLoss naming the fqn on
// any field that is missing or of the wrong shape.
DcpMetadata parse_metadata(const pickle::Value& root);

// Merges the per-rank `__<rank>.metadata` files that dcp.save writes with
// use_collectives=False: a tensor's chunks are the union over ranks (size
// and dtype must agree, DataLoss naming the key otherwise); planner and
// storage entries are united; the first rank's order is kept.
// With a sink, each disagreement is reported there and the first rank's
// description kept.
DcpMetadata merge_rank_metadata(std::vector<DcpMetadata> ranks, ProblemSink* sink = nullptr);

// What SourceInfo keeps of a .metadata (keys, their kinds, planner_data),
// and the metadata a writer needs back from it (items without sizes or
// chunks: a reshard plans those anew).
FlatLayout flat_layout_of(const DcpMetadata& md);
DcpMetadata metadata_of(const FlatLayout& layout);

}  // namespace ckpt::dcp
