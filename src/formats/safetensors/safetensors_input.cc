// safetensors input: one file, or a sharded set named by its index.json.
#include <algorithm>
#include <set>

#include "formats/input_format.h"
#include "formats/safetensors/safetensors_format.h"
#include "formats/safetensors/safetensors_reader.h"

namespace ckpt::safetensors {
namespace {

// safetensors has no magic: an 8-byte header size and a JSON header that
// parses. Every format with a marker answers above it.
int probe_file(const std::string&, const ByteSource& file) {
  return looks_like_safetensors(file) ? confidence::kNames : confidence::kNo;
}

int probe_index(const std::string& path, const ByteSource&) {
  return is_safetensors_index(path) ? confidence::kMarker : confidence::kNo;
}

// A folder holding safetensors weights or their index: what save_pretrained
// writes. (torch's DCP Hugging Face layout, shard-*-model-*.safetensors with
// DCP_SHARDING_INFO, is a refinement that will answer above it.) A folder
// holding only a PEFT adapter answers too, and its reader says what to pass.
int probe_folder(const std::string& dir) {
  HfFolderFiles files = list_hf_folder(dir);
  if (!files.indexes.empty()) return confidence::kIndex;
  if (!files.weights.empty()) return confidence::kLoose;
  return files.adapters.empty() || files.has_bin_model() ? confidence::kNo : confidence::kLoose;
}

// The same with pytorch_model.bin weights, when there are no safetensors ones
// (from_pretrained's order too).
int probe_bin_folder(const std::string& dir) {
  HfFolderFiles files = list_hf_folder(dir);
  if (files.has_safetensors_model()) return confidence::kNo;
  if (!files.bin_indexes.empty()) return confidence::kIndex;
  return files.bin_weights.empty() ? confidence::kNo : confidence::kLoose;
}

CheckpointModel read_folder(const std::string& src, const ReadOptions& options) {
  return read_hf_folder(src, options.problems);
}

CheckpointModel read_file(const std::string& src, const ReadOptions&) { return read_safetensors_file(src); }

// The index and every shard it names are the source's files.
CheckpointModel read_index(const std::string& src, const ReadOptions& options) {
  CheckpointModel model = read_safetensors_index(src, options.problems);
  if (model.info.files.empty()) {
    std::set<std::string> files{src};
    for (const auto& t : model.tensors)
      for (const auto& c : t.chunks) files.insert(c.file);
    model.info.files.assign(files.begin(), files.end());
  }
  return model;
}

}  // namespace

const InputFormat& file_format() {
  static const InputFormat f{.kind = SourceKind::kSafetensors,
                             .probe_file = probe_file,
                             .read = read_file,
                             .description = "a .safetensors file"};
  return f;
}

const InputFormat& folder_format() {
  static const InputFormat f{.kind = SourceKind::kHfFolder,
                             .probe_directory = probe_folder,
                             .read = read_folder,
                             .directory_shape = "Hugging Face *.safetensors weights or their index",
                             .description = "save_pretrained's folder of *.safetensors weights or their index"};
  return f;
}

const InputFormat& bin_folder_format() {
  static const InputFormat f{.kind = SourceKind::kHfBinFolder,
                             .probe_directory = probe_bin_folder,
                             .read = read_folder,
                             .directory_shape = "Hugging Face pytorch_model.bin weights or their index",
                             .description = "save_pretrained's folder of pytorch_model.bin weights or their index"};
  return f;
}

const InputFormat& index_format() {
  static const InputFormat f{.kind = SourceKind::kSafetensorsIndex,
                             .probe_file = probe_index,
                             .read = read_index,
                             .description = "a .safetensors.index.json and the shards it names"};
  return f;
}

}  // namespace ckpt::safetensors
