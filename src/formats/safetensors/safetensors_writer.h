// Writer of safetensors files from a CheckpointModel. Tensors are named by
// their dotted path ("optim.state.layer1.weight.exp_avg") and laid out the
// way safetensors' own serializer does (huggingface/safetensors
// `prepare`): sorted by dtype (its enum order, descending) then by name,
// data contiguous, header padded with spaces to a multiple of 8.
//
// Non-tensor values go into __metadata__ as strings:
//   "format"            "pt" (what transformers checks)
//   "ckptconv.version"  the tool version
//   "ckptconv.values"   JSON object: dotted path -> value (model/value_json)
//   "ckptconv.tree"     JSON of the whole state dict with each tensor as
//                       {"__tensor__": "<name>"}, so the reader rebuilds it
//
// --max-shard-size splits the tensors (in state-dict order) into files as
// huggingface_hub's split_state_dict_into_shards does: a new file starts when
// the next tensor would push the current one past the limit.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/byte_sink.h"
#include "model/checkpoint_model.h"

namespace ckpt::safetensors {

struct PlacedTensor {
  std::size_t index;  // into CheckpointModel::tensors
  std::string name;
  uint64_t begin = 0, end = 0;
};

struct FilePlan {
  std::string file_name;              // "model-00001-of-00002.safetensors" (shards) or the output's name
  std::string header;                 // padded JSON, without the 8-byte length
  std::vector<PlacedTensor> tensors;  // in data order
  uint64_t data_size = 0;
};

struct Plan {
  std::vector<FilePlan> files;
  std::string index_json;  // model.safetensors.index.json when sharded, else empty
};

// One file's layout: `members` (index is the caller's, handed back to
// FillTensor) sorted and placed as safetensors' serializer does, with
// `metadata` as __metadata__ (none when empty). InvalidArgument for a dtype
// safetensors lacks.
struct FileMember {
  std::size_t index;
  std::string name;
  DType dtype;
  Shape shape;
};
FilePlan plan_file(std::vector<FileMember> members, const std::map<std::string, std::string>& metadata);

// Pure: names, shards, headers. `output_name` is the file name of -o;
// max_shard_size 0 means one file. InvalidArgument for dtypes safetensors
// lacks and for two tensors whose dotted paths collide.
Plan plan_safetensors(const CheckpointModel& model, const std::string& output_name, uint64_t max_shard_size);

// Appends exactly the output bytes of tensor `index`.
using FillTensor = std::function<void(std::size_t index, ByteSink& sink)>;

// Writes one file of the plan: length, header, then each tensor's data.
void write_safetensors_file(ByteSink& sink, const FilePlan& file, const FillTensor& fill);

}  // namespace ckpt::safetensors
