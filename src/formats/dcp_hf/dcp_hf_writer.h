// The files torch's HuggingFaceStorageWriter(save_distributed=True) writes
// for one rank (torch/distributed/checkpoint/filesystem.py with
// SerializationFormat.SAFETENSORS): "shard-0000{r+1}-model-00001-of-00001.safetensors"
// holding the rank's pieces under their FQNs, laid out by safetensors'
// serializer, with __metadata__
//   "DCP_SHARDING_INFO"  json.dumps({fqn: {"saved_offsets": [..]}}) in item order
//   "DCP_VERSION"        "1.0"
//   "format"             "pt"
// A rank with no pieces writes no file (its save plan is empty). Pure: no I/O.
#pragma once

#include <string>
#include <vector>

#include "formats/safetensors/safetensors_writer.h"

namespace ckpt::dcp_hf {

// One piece a rank holds: `index` is the caller's (handed back to FillTensor).
struct Piece {
  std::size_t index;
  std::string fqn;
  DType dtype;
  Shape offsets;
  Shape sizes;
};

// "shard-00001-model-00001-of-00001.safetensors" for rank 0.
std::string rank_file_name(int rank);

// Rank `rank`'s file. InvalidArgument for a dtype safetensors lacks.
safetensors::FilePlan plan_rank_file(int rank, const std::vector<Piece>& pieces);

}  // namespace ckpt::dcp_hf
