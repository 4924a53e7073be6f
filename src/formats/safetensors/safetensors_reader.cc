#include "formats/safetensors/safetensors_reader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/problems.h"
#include "formats/safetensors/safetensors_format.h"
#include "model/ordered_json.h"
#include "model/value_json.h"

namespace ckpt::safetensors {
namespace {

using Json = nlohmann::ordered_json;
using pickle::Value;
using pickle::ValuePtr;

constexpr int kMaxDepth = 200;

// True when every {"__tensor__": name} in the tree names a tensor of this
// file (one shard of a sharded output names tensors of the others).
bool all_tensors_present(const Json& j, const std::map<std::string, std::size_t>& tensors, int depth) {
  if (depth > kMaxDepth) fail_data_loss("ckptconv.tree nests too deeply");
  if (j.is_object()) {
    auto it = j.find("__tensor__");
    if (j.size() == 1 && it != j.end() && it->is_string()) return tensors.count(it->get<std::string>()) > 0;
    for (const auto& v : j)
      if (!all_tensors_present(v, tensors, depth + 1)) return false;
  } else if (j.is_array()) {
    for (const auto& v : j)
      if (!all_tensors_present(v, tensors, depth + 1)) return false;
  }
  return true;
}

// Collects the tensors of one or more files (the shards of one state dict)
// and builds the model's tree once all are in.
class ModelBuilder {
 public:
  ModelBuilder(const std::string& source, ProblemSink* sink) : sink_(sink) { model_.source = source; }

  void add_file(const std::string& path) {
    with_context(path, [&] {
      SourcePtr file = open_mapped_source(path);
      uint64_t data_start = 0;
      Header header = read_header(*file, data_start);
      for (const auto& h : header.tensors) add_tensor(h, file, data_start, path);
      for (const auto& [k, v] : header.metadata) {
        if (k == "ckptconv.tree")
          tree_ = v;
        else if (k != "ckptconv.values")
          model_.facts["metadata." + k] = v;
      }
    });
  }

  CheckpointModel finish() && {
    Json j;
    if (tree_) {
      j = parse_ordered_json(*tree_, kMaxDepth + 1, "__metadata__ ckptconv.tree");
    }
    if (tree_ && all_tensors_present(j, by_name_, 0)) {
      model_.root = value_from_json(
          j,
          [&](const Json& ref) {
            if (!ref.is_string()) fail_data_loss("ckptconv.tree: __tensor__ is not a tensor name");
            return make_tensor_ref(by_name_.at(ref.get<std::string>()));
          },
          kMaxDepth);
      prune_unreferenced(model_.root, model_.tensors);
    } else {
      model_.root = Value::dict(std::move(flat_));
      model_.info.flat_keys = true;
    }
    return std::move(model_);
  }

 private:
  void add_tensor(const HeaderTensor& h, const SourcePtr& file, uint64_t data_start, const std::string& path) {
    if (by_name_.count(h.name)) {
      const std::string& first = model_.tensors[by_name_[h.name]].chunks[0].file;
      std::string where =
          first == path ? "is named twice in the header" : "is in two shards (" + first + " and " + path + ")";
      return report_or_fail(sink_, {ErrorCode::kDataLoss, "tensor '" + h.name + "' " + where, path, -1, h.name});
    }
    TensorEntry t;
    t.name = h.name;
    t.dtype = h.dtype;
    t.shape = h.shape;
    TensorChunk c;
    c.offsets.assign(h.shape.size(), 0);
    c.sizes = h.shape;
    c.storage = make_sub_source(file, data_start + h.begin, h.end - h.begin);
    c.strides = contiguous_strides(h.shape);
    c.file = path;
    t.chunks.push_back(std::move(c));
    by_name_[h.name] = model_.tensors.size();
    flat_.emplace_back(Value::str(h.name), make_tensor_ref(model_.tensors.size()));
    model_.tensors.push_back(std::move(t));
  }

  CheckpointModel model_;
  std::map<std::string, std::size_t> by_name_;
  std::vector<std::pair<ValuePtr, ValuePtr>> flat_;
  std::optional<std::string> tree_;
  ProblemSink* sink_;
};

constexpr uint64_t kMaxIndexSize = 100'000'000;

}  // namespace

CheckpointModel read_safetensors_file(const std::string& path) {
  ModelBuilder builder(path, nullptr);
  builder.add_file(path);
  return std::move(builder).finish();
}

bool is_safetensors_index(const std::string& path) { return path.ends_with(".safetensors.index.json"); }

CheckpointModel read_safetensors_index(const std::string& path, ProblemSink* sink) {
  return with_context(path, [&] {
    SourcePtr src = open_file_source(path);
    if (src->size() > kMaxIndexSize) fail_data_loss("index larger than " + std::to_string(kMaxIndexSize) + " bytes");
    Json index = Json::parse(src->read_string(0, static_cast<std::size_t>(src->size())), nullptr, false);
    if (index.is_discarded() || !index.is_object()) fail_data_loss("not a JSON object");
    auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object()) fail_data_loss("no weight_map object");
    // Shards in the order of their names (model-00001-of-...), each once.
    std::set<std::string> files;
    for (const auto& file : *map) {
      if (!file.is_string()) fail_data_loss("weight_map value is not a file name");
      const std::string& name = file.get_ref<const std::string&>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        fail(ErrorCode::kUnsafe, "weight_map names '" + name + "', not a file beside the index");
      files.insert(name);
    }
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    ModelBuilder builder(path, sink);
    std::set<std::string> unreadable;
    for (const auto& name : files) {
      std::string shard = (dir / name).string();
      if (!run_reporting(sink, shard, -1, "", [&] { builder.add_file(shard); })) unreadable.insert(name);
    }
    CheckpointModel model = std::move(builder).finish();
    std::map<std::string, std::string> held;  // tensor -> the shard that holds it
    for (const auto& t : model.tensors) held[t.name] = std::filesystem::path(t.chunks.at(0).file).filename().string();
    for (auto it = map->begin(); it != map->end(); ++it) {
      const std::string& listed = it->get_ref<const std::string&>();
      auto h = held.find(it.key());
      if (h == held.end() && !unreadable.count(listed))
        report_or_fail(sink,
                       {ErrorCode::kDataLoss,
                        "weight_map lists tensor '" + it.key() + "' that no shard holds (" + listed + " does not)",
                        (dir / listed).string(), -1, it.key()});
      else if (h != held.end() && h->second != listed)
        report_or_fail(sink, {ErrorCode::kDataLoss,
                              "weight_map puts tensor '" + it.key() + "' in " + listed + ", but " + h->second +
                                  " holds it: the index does not match the shards",
                              (dir / h->second).string(), -1, it.key()});
    }
    for (const auto& [name, shard] : held)
      if (!map->contains(name))
        report_or_fail(sink, {ErrorCode::kDataLoss,
                              shard + " holds tensor '" + name +
                                  "', which the index does not list: the index does not match the shards",
                              (dir / shard).string(), -1, name});
    return model;
  });
}

bool is_weights_file_name(const std::string& name) {
  static const char* const kWeights[] = {".safetensors", ".bin", ".pt",   ".pth",  ".ckpt", ".h5",        ".hdf5",
                                         ".msgpack",     ".npz", ".gguf", ".onnx", ".pkl",  ".index.json"};
  for (const char* ext : kWeights)
    if (name.ends_with(ext)) return true;
  return false;
}

HfFolderFiles list_hf_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  HfFolderFiles out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    std::string name = entry.path().filename().string();
    if (is_safetensors_index(name))
      out.indexes.push_back(entry.path().string());
    else if (name.ends_with(".safetensors"))
      out.weights.push_back(entry.path().string());
    else
      out.others.push_back(name);
  }
  for (auto* v : {&out.indexes, &out.weights, &out.others}) std::sort(v->begin(), v->end());
  return out;
}

CheckpointModel read_hf_folder(const std::string& dir, ProblemSink* sink) {
  namespace fs = std::filesystem;
  HfFolderFiles files = list_hf_folder(dir);
  CheckpointModel model;
  if (!files.indexes.empty()) {
    std::string index = files.indexes.front();
    if (files.indexes.size() > 1) {
      std::string names;
      for (const auto& i : files.indexes) names += (names.empty() ? "" : ", ") + fs::path(i).filename().string();
      auto main = std::find_if(files.indexes.begin(), files.indexes.end(), [](const std::string& i) {
        return fs::path(i).filename() == "model.safetensors.index.json";
      });
      if (main == files.indexes.end())
        fail_invalid(dir + " holds several safetensors indexes (" + names + "): pass the one to read");
      index = *main;
    }
    model = read_safetensors_index(index, sink);
    std::set<std::string> read{index};
    for (const auto& t : model.tensors) read.insert(t.chunks.at(0).file);
    model.info.files.assign(read.begin(), read.end());
  } else {
    if (files.weights.empty()) fail(ErrorCode::kNotFound, dir + ": no .safetensors file and no index");
    // Without an index the files together are the model (a tensor in two of
    // them is DataLoss, as with an index).
    ModelBuilder builder(dir, sink);
    for (const auto& w : files.weights) run_reporting(sink, w, -1, "", [&] { builder.add_file(w); });
    model = std::move(builder).finish();
    model.info.files = files.weights;
  }
  model.source = dir;
  std::string others;
  for (const auto& o : files.others) {
    others += (others.empty() ? "" : ", ") + o;
    if (!is_weights_file_name(o)) model.info.side_files.push_back((fs::path(dir) / o).string());
  }
  if (!others.empty()) model.facts["hf_folder_files"] = others;
  return model;
}

}  // namespace ckpt::safetensors
