#include "formats/safetensors/safetensors_reader.h"

#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors/safetensors_format.h"
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

}  // namespace

CheckpointModel read_safetensors_file(const std::string& path) {
  return with_context(path, [&] {
    SourcePtr file = open_mapped_source(path);
    uint64_t data_start = 0;
    Header header = read_header(*file, data_start);
    CheckpointModel model;
    model.format = "safetensors";
    model.source = path;
    std::map<std::string, std::size_t> by_name;
    std::vector<std::pair<ValuePtr, ValuePtr>> flat;
    for (const auto& h : header.tensors) {
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
      by_name[h.name] = model.tensors.size();
      flat.emplace_back(Value::str(h.name), make_tensor_ref(model.tensors.size()));
      model.tensors.push_back(std::move(t));
    }
    auto tree = header.metadata.find("ckptconv.tree");
    Json j;
    if (tree != header.metadata.end()) {
      j = Json::parse(tree->second, nullptr, false);
      if (j.is_discarded()) fail_data_loss("__metadata__ ckptconv.tree is not valid JSON");
    }
    if (tree != header.metadata.end() && all_tensors_present(j, by_name, 0)) {
      model.root = value_from_json(j, [&](const Json& ref) {
        if (!ref.is_string()) fail_data_loss("ckptconv.tree: __tensor__ is not a tensor name");
        return make_tensor_ref(by_name.at(ref.get<std::string>()));
      }, kMaxDepth);
      prune_unreferenced(model.root, model.tensors);
    } else {
      model.root = Value::dict(std::move(flat));
    }
    for (const auto& [k, v] : header.metadata)
      if (k != "ckptconv.tree" && k != "ckptconv.values") model.facts["metadata." + k] = v;
    return model;
  });
}

}  // namespace ckpt::safetensors
