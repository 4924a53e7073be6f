// Reader of safetensors files into a CheckpointModel: the header validated
// (safetensors_format.h), each tensor one contiguous chunk pointing into the
// file. A file written by ckptconv gets its state dict back from the
// "ckptconv.tree" metadata, followed only when it names every tensor of the
// files read (one naming fewer is DataLoss: following it would drop the
// others; one naming more is a shard read alone, read flat, or DataLoss in a
// folder without index, where it means a missing file); any other file is
// a flat dict name -> tensor, in header order. Tensor bytes are never read
// here.
#pragma once

#include <string>
#include <vector>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::safetensors {

// A whole .safetensors file as a model (format "safetensors").
CheckpointModel read_safetensors_file(const std::string& path);

// Hugging Face's sharded layout: "<name>.safetensors.index.json" whose
// weight_map names shard files beside it. The shards together are one
// model; a tensor in two shards, or listed but in none, is DataLoss; a file
// name with a '/' is Unsafe.
bool is_safetensors_index(const std::string& path);
// `sink` (validate): a shard that cannot be read and each tensor missing or
// doubled is reported there instead of thrown.
// The index must agree with the shards' headers: a tensor a shard holds but
// the index does not list, or lists in another shard, is DataLoss too.
CheckpointModel read_safetensors_index(const std::string& path, ProblemSink* sink = nullptr);

// A Hugging Face model folder, as save_pretrained writes it: its
// "*.safetensors.index.json" and the shards it names, or without an index
// its .safetensors files together (one model.safetensors, or shards whose
// index was not copied). With several indexes, model.safetensors.index.json
// is read, else InvalidArgument naming them. Without safetensors weights,
// the same for pytorch_model.bin (its "*.bin.index.json" and shards
// pytorch_model-0000k-of-0000N.bin; kHfBinFolder). A PEFT adapter
// (adapter_model.safetensors / .bin) is never part of the model: it is
// listed (facts "hf_adapter"), and a folder holding only an adapter is
// InvalidArgument naming the file to read. The other files (config.json,
// generation_config.json, tokenizer files) are listed in facts, not read;
// config.json's tied weights are added (hf_tied_weights.h).
struct HfFolderFiles {
  std::vector<std::string> indexes;      // *.safetensors.index.json, sorted
  std::vector<std::string> weights;      // *.safetensors but an adapter's, sorted
  std::vector<std::string> bin_indexes;  // *.bin.index.json, sorted
  std::vector<std::string> bin_weights;  // pytorch_model.bin, pytorch_model-NNNNN-of-NNNNN.bin, sorted
  std::vector<std::string> adapters;     // adapter_model.safetensors, adapter_model.bin (PEFT)
  std::vector<std::string> others;       // every other regular file's name, sorted

  bool has_safetensors_model() const { return !indexes.empty() || !weights.empty(); }
  bool has_bin_model() const { return !bin_indexes.empty() || !bin_weights.empty(); }
};
HfFolderFiles list_hf_folder(const std::string& dir);
// Weights in some format or their index (pytorch_model.bin, *.index.json,
// *.gguf, ...): what a folder output never carries from its source.
bool is_weights_file_name(const std::string& name);
CheckpointModel read_hf_folder(const std::string& dir, ProblemSink* sink = nullptr);

}  // namespace ckpt::safetensors
