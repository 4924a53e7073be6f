#include "formats/megatron/megatron_writer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/paths.h"
#include "formats/torch_pt/pt_writer.h"
#include "io/byte_sink.h"
#include "model/tree_walk.h"

namespace ckpt::megatron {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

std::string dotted(const std::vector<int64_t>& v) {
  std::string out;
  for (int64_t x : v) out += (out.empty() ? "" : ".") + std::to_string(x);
  return out;
}

// Each shard of the object `value` (nested lists by `shape`), in row-major
// order, as the items megatron-core writes: KEY/shard_<offsets>_<shape> -> [value].
void add_object_items(const std::string& key, const ValuePtr& value, const std::vector<int64_t>& shape,
                      std::vector<int64_t> offsets, ValuePtr& into) {
  std::size_t dim = offsets.size();
  ValuePtr list = mapping_of(value);
  if (!list->is(Kind::kList) || list->items.size() != static_cast<std::size_t>(shape.at(dim)))
    fail_invalid("sharded object '" + key + "' is no longer a list of " + std::to_string(shape.at(dim)) +
                 " values; reshard --layout megatron writes a torch_dist checkpoint as it was read");
  for (std::size_t i = 0; i < list->items.size(); ++i) {
    offsets.push_back(static_cast<int64_t>(i));
    if (dim + 1 == shape.size())
      into->entries.emplace_back(Value::str(key + "/shard_" + dotted(offsets) + "_" + dotted(shape)),
                                 Value::list({list->items[i]}));
    else
      add_object_items(key, list->items[i], shape, offsets, into);
    offsets.pop_back();
  }
}

}  // namespace

TorchDistOutput torch_dist_output(const CheckpointModel& stored) {
  if (!stored.info.megatron)
    fail_invalid(
        "--layout megatron: the source must be a Megatron-core torch_dist checkpoint read whole (no "
        "--only, which unstacks the layers into a model's own names: write those with --layout dcp)");
  const MegatronLayout& layout = *stored.info.megatron;
  std::set<std::string> common(layout.common_keys.begin(), layout.common_keys.end());
  std::map<std::string, std::vector<int64_t>> objects(layout.objects.begin(), layout.objects.end());
  TorchDistOutput out;
  out.items = stored;
  ValuePtr root = Value::dict();
  for (const auto& [k, v] : mapping_of(stored.root)->entries) {
    std::string key = path_component(*k);
    if (common.count(key)) continue;
    auto object = objects.find(key);
    if (object == objects.end())
      root->entries.emplace_back(k, v);
    else
      add_object_items(key, v, object->second, {}, root);
  }
  out.items.root = root;
  prune_unreferenced(out.items.root, out.items.tensors);
  for (const std::string& f : stored.info.files) {
    std::string name = file_name(f);
    if (name == "common.pt" || name == "metadata.json") out.side_files.push_back(f);
  }
  return out;
}

namespace {

// "decoder.layers.<i>.<rest>": the layer and the stacked key
// "decoder.layers.<rest>"; nullopt for a key outside the layers.
std::optional<std::pair<int64_t, std::string>> layer_key(const std::string& key) {
  static const std::string kHead = "decoder.layers.";
  if (key.rfind(kHead, 0) != 0) return std::nullopt;
  std::size_t end = kHead.size();
  while (end < key.size() && std::isdigit(static_cast<unsigned char>(key[end]))) ++end;
  if (end == kHead.size() || end - kHead.size() > 9 || end >= key.size() || key[end] != '.') return std::nullopt;
  return std::make_pair(std::stoll(key.substr(kHead.size(), end - kHead.size())), kHead + key.substr(end + 1));
}

// The layers' tensors as one, stacked on a new leading axis: layer i's
// chunks at offset i (its bytes where they are).
TensorEntry stacked(const std::vector<const TensorEntry*>& layers, const std::string& key) {
  TensorEntry out = *layers.at(0);
  out.name = key;
  out.chunks.clear();
  out.shape.insert(out.shape.begin(), static_cast<int64_t>(layers.size()));
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const TensorEntry& t = *layers[i];
    if (t.dtype != layers[0]->dtype || t.shape != layers[0]->shape)
      fail_invalid("--layout megatron: '" + t.name + "' is " + std::string(dtype_name(t.dtype)) + " " +
                   shape_str(t.shape) + ", layer 0's is " + std::string(dtype_name(layers[0]->dtype)) + " " +
                   shape_str(layers[0]->shape) + ": the layers do not stack into '" + key + "'");
    for (TensorChunk c : t.chunks) {
      const int64_t whole = c.sizes.empty() ? 1 : c.sizes[0] * c.strides[0];  // a stride for the one slice
      c.offsets.insert(c.offsets.begin(), static_cast<int64_t>(i));
      c.sizes.insert(c.sizes.begin(), 1);
      c.strides.insert(c.strides.begin(), std::max<int64_t>(whole, 1));
      out.chunks.push_back(std::move(c));
    }
  }
  return out;
}

// torch.save({}) as megatron-core's save_common writes it for a state
// dict whose every entry is sharded.
std::string empty_common_pt() {
  MemorySink sink;
  torch_pt::write_pt(
      sink, *Value::dict(), {}, [](std::size_t, archive::ZipWriter&) {}, "common");
  return sink.take();
}

}  // namespace

TorchDistOutput torch_dist_from_model(const CheckpointModel& model) {
  // Per stacked key, its layers in order of first appearance.
  std::vector<std::string> order;
  std::map<std::string, std::map<int64_t, ValuePtr>> layers;
  std::vector<std::pair<ValuePtr, ValuePtr>> plain;  // outside the layers: tensors as they are
  for (const auto& [k, v] : mapping_of(model.root)->entries) {
    const std::string key = path_component(*k);
    if (auto lk = layer_key(key)) {
      auto& slot = layers[lk->second];
      if (slot.empty()) order.push_back(lk->second);
      slot[lk->first] = v;
    } else if (tensor_ref_index(*v)) {
      plain.emplace_back(Value::str(key), v);
    } else {
      fail_invalid("--layout megatron: '" + key +
                   "' is a value outside the transformer layers; only a model's tensors and its layers' "
                   "_extra_state objects are written");
    }
  }
  TorchDistOutput out;
  out.items.info = model.info;
  out.items.info.flat_layout.reset();
  out.items.source = model.source;
  ValuePtr root = Value::dict();
  for (auto& e : plain) {
    TensorEntry t = model.tensors.at(*tensor_ref_index(*e.second));
    t.name = path_component(*e.first);
    root->entries.emplace_back(e.first, make_tensor_ref(out.items.tensors.size()));
    out.items.tensors.push_back(std::move(t));
  }
  int64_t count = -1;
  for (const std::string& key : order) {
    const auto& slices = layers.at(key);
    const int64_t n = slices.rbegin()->first + 1;
    if (count < 0) count = n;
    if (n != count || static_cast<int64_t>(slices.size()) != n)
      fail_invalid("--layout megatron: '" + key + "' has " + std::to_string(slices.size()) + " layers up to " +
                   std::to_string(n - 1) + ", not the " + std::to_string(count) +
                   " every stacked key needs (a layer missing?)");
    bool tensor = tensor_ref_index(*slices.begin()->second).has_value();
    std::vector<const TensorEntry*> parts;
    for (const auto& [i, v] : slices) {
      auto idx = tensor_ref_index(*v);
      if (idx.has_value() != tensor)
        fail_invalid("--layout megatron: '" + key + "' is a tensor in some layers and a value in others");
      if (idx) parts.push_back(&model.tensors.at(*idx));
    }
    if (tensor) {
      root->entries.emplace_back(Value::str(key), make_tensor_ref(out.items.tensors.size()));
      out.items.tensors.push_back(stacked(parts, key));
    } else {
      // A sharded object of shape (layers,): one item per layer.
      std::vector<ValuePtr> values;
      for (const auto& [i, v] : slices) values.push_back(v);
      add_object_items(key, Value::list(std::move(values)), {n}, {}, root);
    }
  }
  out.items.root = root;
  out.made_files = {
      {"common.pt", empty_common_pt()},
      {"metadata.json", R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", )"
                        R"("common_backend_version": 1})"}};
  return out;
}

}  // namespace ckpt::megatron
