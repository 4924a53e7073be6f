// Writer of torch.distributed.checkpoint directories (docs/formats.md §2):
//
//   DST/.metadata          pickle of Metadata (below), protocol 2
//   DST/__<r>_0.distcp     one per rank: torch.save archives concatenated
//                          with no padding, each item at [offset, offset+length)
//                          (zip offsets inside an item count from its start)
//
// The metadata is the value tree torch 2.15 pickles, NEWOBJ + BUILD:
//   Metadata{state_dict_metadata: {fqn: TensorStorageMetadata{properties:
//              TensorProperties(state (dtype, _get_layout('torch.strided'), False,
//              _MEM_FORMAT_ENCODING(0), False, strides)), size: torch.Size,
//              chunks: [ChunkStorageMetadata{offsets, sizes}]} | BytesStorageMetadata{}},
//            planner_data: {fqn: (path...)},
//            storage_data: {MetadataIndex{fqn, index, offset}: _StorageInfo{relative_path, offset, length}},
//            storage_meta: StorageMeta{checkpoint_id: str | None, save_id, load_id: None, modules: []},
//            version: "1.0.0"}
// Bytes items' MetadataIndex carry no offset (torch leaves it at the class default).
//
// These are the format's encoders; exec/write_dcp.h drives them into a
// directory that appears complete or not at all.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "formats/dcp/dcp_metadata.h"
#include "formats/torch_pt/pt_writer.h"
#include "io/byte_sink.h"

namespace ckpt::dcp {

// The .metadata pickle for `md` (items, planner_data in planner_order,
// storage). Tensor chunk storage is keyed (fqn, chunk offsets), bytes items
// (fqn, {}). Internal error when an item's storage entry is missing.
std::string encode_metadata(const DcpMetadata& md, const std::optional<std::string>& checkpoint_id,
                            const std::string& save_id);

// A fresh storage_meta.save_id (a random UUID4, as dcp.save makes one).
std::string random_save_id();

// Appends one item, a torch.save archive of `root`, at the sink's position
// in rank `rank`'s file; returns where it went.
StorageInfo append_item_to(ByteSink& sink, int rank, const pickle::Value& root,
                           const std::vector<torch_pt::OutputTensor>& tensors, const torch_pt::FillTensor& fill);

// The name of rank r's file in a DCP directory, as FileSystemWriter names it.
inline std::string rank_file_name(int rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

}  // namespace ckpt::dcp
