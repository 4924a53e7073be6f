#include "formats/megatron/megatron_writer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "formats/megatron_legacy/tp_layout.h"
#include "formats/torch_pt/pt_writer.h"
#include "io/byte_sink.h"
#include "model/tree_walk.h"
#include "pickle/framework_objects.h"

namespace ckpt::megatron {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

std::string dotted(const std::vector<int64_t>& v) {
  std::string out;
  for (int64_t x : v) {
    if (!out.empty()) out += '.';
    out += std::to_string(x);
  }
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

// The stored view (as the torch_dist reader gives it: tensors and objects
// under their stored keys, common.pt's entries at the top) as DCP items.
CheckpointModel items_of(const CheckpointModel& stored, const MegatronLayout& layout) {
  std::set<std::string> common(layout.common_keys.begin(), layout.common_keys.end());
  std::map<std::string, std::vector<int64_t>> objects(layout.objects.begin(), layout.objects.end());
  CheckpointModel items = stored;
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
  items.root = root;
  prune_unreferenced(items.root, items.tensors);
  return items;
}

// What megatron-core's torch_dist save writes as metadata.json (0.16.1).
constexpr const char* kTorchDistMetadata =
    R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", )"
    R"("common_backend_version": 1})";

// ---- from a Megatron-LM legacy checkpoint ----

// `c` as the piece of layer `layer` of a stack: a leading axis of size 1 at
// that offset (its stride never steps, any value does).
TensorChunk with_layer_axis(TensorChunk c, int64_t layer) {
  c.offsets.insert(c.offsets.begin(), layer);
  c.strides.insert(c.strides.begin(), static_cast<int64_t>(std::max<uint64_t>(c.numel(), 1)));
  c.sizes.insert(c.sizes.begin(), 1);
  return c;
}

// The layers' tensors (of `source`) as one under `key`, stacked on a new
// leading axis: layer i's chunks at offset i, its bytes where they are (a
// layer's experts stack the same way, on the axis after the layers').
// Layers of another dtype or shape do not stack: Unimplemented naming both.
TensorEntry stack_layers(const std::vector<const TensorEntry*>& layers, const std::string& key,
                         const std::string& source) {
  TensorEntry out = *layers.at(0);
  out.name = key;
  out.chunks.clear();
  out.shape.insert(out.shape.begin(), static_cast<int64_t>(layers.size()));
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const TensorEntry& t = *layers[i];
    if (t.dtype != layers[0]->dtype || t.shape != layers[0]->shape)
      fail(ErrorCode::kUnimplemented,
           source + ": '" + t.name + "' is " + std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape) + ", '" +
               layers[0]->name + "' " + std::string(dtype_name(layers[0]->dtype)) + " " + shape_str(layers[0]->shape) +
               "; layers (or experts) that differ do not stack into '" + key + "'");
    for (const TensorChunk& c : t.chunks) out.chunks.push_back(with_layer_axis(c, static_cast<int64_t>(i)));
  }
  return out;
}

bool bool_entry(const ValuePtr& args, std::string_view key) {
  ValuePtr v = args->get(key);
  return v && v->is(Kind::kBool) && v->as_bool();
}

// One stored key of the layers: each layer's value, by global layer index.
struct LayerStack {
  std::string key;
  std::size_t place = 0;  // its entry in the stored root
  std::vector<ValuePtr> layers;
};

// The legacy reader's TP=1/PP=1 model (layers under their global index,
// the module's own names) as the stored view of a torch_dist checkpoint
// of the same model, the job's entries as common.pt's.
class LegacyStacker {
 public:
  explicit LegacyStacker(const CheckpointModel& legacy) : legacy_(legacy) {}

  TorchDistOutput run() {
    ValuePtr root = mapping_of(legacy_.root);
    ValuePtr model = root->is(Kind::kDict) ? root->get("model") : nullptr;
    ValuePtr args = root->is(Kind::kDict) ? root->get("args") : nullptr;
    if (!model || !args)
      fail_invalid(legacy_.source +
                   ": --layout megatron writes a Megatron-LM legacy checkpoint read whole (no --only): its model, "
                   "and its args, which say the layer spec and go into common.pt with the iteration");
    args = mapping_of(args);
    spec_of(args);
    log::warn(legacy_.source +
              ": the optimizer and RNG states are not written (per rank; not resharded yet): load the output with "
              "--no-load-optim --no-load-rng");
    stored_ = legacy_;
    stored_.root = Value::dict();
    stack_model(mapping_of(model));
    MegatronLayout layout;
    ValuePtr common = Value::dict();
    for (const auto& [k, v] : root->entries) {
      const std::string key = path_component(*k);
      if (key == "model") continue;
      stored_.root->entries.emplace_back(k, v);
      common->entries.emplace_back(k, v);
      layout.common_keys.push_back(key);
    }
    for (const LayerStack& s : stacks_)
      if (!tensor_ref_index(*stored_.root->entries.at(s.place).second))
        layout.objects.push_back({s.key, {num_layers_}});
    TorchDistOutput out;
    out.items = items_of(stored_, layout);
    out.side_files.push_back({"common.pt", common_pt(common)});
    out.side_files.push_back({"metadata.json", kTorchDistMetadata});
    return out;
  }

 private:
  // Which keys map the layers' names (args.transformer_impl).
  void spec_of(const ValuePtr& args) {
    ValuePtr impl = args->get("transformer_impl");
    const std::string name = impl && impl->is(Kind::kStr) ? impl->as_str() : "";
    if (name != "local" && name != "transformer_engine")
      fail(ErrorCode::kUnimplemented,
           legacy_.source + ": args.transformer_impl is " + (impl ? impl->repr() : std::string("absent")) +
               "; the stored names of megatron-core's local and transformer_engine GPT layer specs are known");
    local_spec_ = name == "local";
    // Tied embeddings: the last stage's output_layer.weight is a copy of the
    // word embeddings, which megatron-core stores once, under the embedding's key.
    tied_ = !bool_entry(args, "untie_embeddings_and_output_weights");
  }

  void stack_model(const ValuePtr& model) {
    std::map<std::string, std::size_t> stack_of;
    for (const auto& [k, v] : model->entries) {
      const std::string name = path_component(*k);
      std::optional<megatron_legacy::LayerIndexAt> at = megatron_legacy::layer_index_in(name);
      if (!at) {
        add_unstacked(name, k, v);
        continue;
      }
      const std::string key =
          name.substr(0, at->pos) + megatron_legacy::stored_layer_name(name.substr(at->pos + at->len + 1), local_spec_);
      auto [it, added] = stack_of.emplace(key, stacks_.size());
      if (added) {
        stacks_.push_back({key, stored_.root->entries.size(), {}});
        stored_.root->entries.emplace_back(Value::str(key), nullptr);
      }
      LayerStack& s = stacks_[it->second];
      const auto index = static_cast<std::size_t>(at->index);
      if (s.layers.size() <= index) s.layers.resize(index + 1);
      if (s.layers[index])
        fail_data_loss(legacy_.source + ": two model entries are stored as '" + key + "' of layer " +
                       std::to_string(at->index) + " ('" + name + "')");
      s.layers[index] = v;
      num_layers_ = std::max(num_layers_, at->index + 1);
    }
    for (LayerStack& s : stacks_) stored_.root->entries.at(s.place).second = stacked(s);
  }

  // An entry outside the layers, under its own name; GPTModel's
  // sharded_state_dict leaves output_layer._extra_state out (None in old
  // checkpoints too), and a tied output layer.
  void add_unstacked(const std::string& name, const ValuePtr& k, const ValuePtr& v) {
    const bool tensor = tensor_ref_index(*v).has_value();
    if (name == "output_layer._extra_state" && mapping_of(v)->is(Kind::kNone)) return;
    if (name == "output_layer.weight" && tied_) return;
    if (!tensor)
      fail(ErrorCode::kUnimplemented, legacy_.source + ": model entry '" + name +
                                          "' is an object outside the layers; how megatron-core shards it is not "
                                          "known here");
    stored_.root->entries.emplace_back(k, v);
  }

  // A stack's layers as one tensor with a leading num_layers axis, or one
  // sharded object (a list, one value per layer) for _extra_state.
  ValuePtr stacked(const LayerStack& s) {
    if (static_cast<int64_t>(s.layers.size()) != num_layers_ ||
        std::any_of(s.layers.begin(), s.layers.end(), [](const ValuePtr& v) { return !v; }))
      fail(ErrorCode::kUnimplemented, legacy_.source + ": '" + s.key + "' is not in every one of the " +
                                          std::to_string(num_layers_) +
                                          " layers; layers that differ do not stack into one tensor");
    const bool object = s.key.size() > 13 && s.key.compare(s.key.size() - 13, 13, "._extra_state") == 0;
    if (object) {
      for (const ValuePtr& v : s.layers)
        if (tensor_ref_index(*v)) fail_data_loss(legacy_.source + ": '" + s.key + "' is a tensor in a layer");
      return Value::list(s.layers);
    }
    std::vector<const TensorEntry*> parts;
    for (std::size_t i = 0; i < s.layers.size(); ++i) {
      auto idx = tensor_ref_index(*s.layers[i]);
      if (!idx) fail_data_loss(legacy_.source + ": '" + s.key + "' of layer " + std::to_string(i) + " is not a tensor");
      parts.push_back(&stored_.tensors.at(*idx));
    }
    TensorEntry out = stack_layers(parts, s.key, legacy_.source);
    stored_.tensors.push_back(std::move(out));
    return make_tensor_ref(stored_.tensors.size() - 1);
  }

  // common.pt: torch.save of the job's entries, each framework object (the
  // args Namespace, megatron enums, numpy values) as it was stored.
  std::string common_pt(const ValuePtr& common) const {
    if (pickle::find_node(*common, [](const Value& v) { return tensor_ref_index(v).has_value(); }))
      fail(ErrorCode::kUnimplemented, legacy_.source +
                                          ": a job entry beside the model holds a tensor; common.pt is written "
                                          "from plain values only");
    MemorySink sink;
    torch_pt::write_pt(
        sink, *pickle::with_stored_objects(common), {}, [](std::size_t, archive::ZipWriter&) {}, "common");
    return sink.take();
  }

  const CheckpointModel& legacy_;
  CheckpointModel stored_;
  std::vector<LayerStack> stacks_;
  int64_t num_layers_ = 0;
  bool local_spec_ = false, tied_ = false;
};

}  // namespace

TorchDistOutput torch_dist_output(const CheckpointModel& stored) {
  if (stored.info.kind == SourceKind::kMegatronLegacy) return LegacyStacker(stored).run();
  if (!stored.info.megatron)
    fail_invalid(
        "--layout megatron: the source must be a Megatron-core torch_dist checkpoint or a Megatron-LM legacy one, "
        "read whole (no --only, which unstacks the layers into a model's own names: write those with --layout dcp)");
  TorchDistOutput out;
  out.items = items_of(stored, *stored.info.megatron);
  for (const std::string& f : stored.info.files) {
    std::string name = file_name(f);
    if (name == "common.pt" || name == "metadata.json") out.side_files.push_back(read_side_file(f));
  }
  return out;
}

namespace {

// The decimal index at `key[pos...]` up to the next '.', and where that
// '.' is; nullopt for no index there.
std::optional<std::pair<int64_t, std::size_t>> index_at(const std::string& key, std::size_t pos) {
  std::size_t end = pos;
  while (end < key.size() && std::isdigit(static_cast<unsigned char>(key[end]))) ++end;
  if (end == pos || end - pos > 9 || end >= key.size() || key[end] != '.') return std::nullopt;
  return std::make_pair(std::stoll(key.substr(pos, end - pos)), end);
}

// Where a model key sits in megatron-core's stacks, the inverse of the
// torch_dist reader's splitting (megatron_reader.cc, stack_of):
//   "decoder.layers.<i>.<rest>" is layer i of "decoder.layers.<rest>";
//   in it, "<…>.mlp.experts.local_experts.<e>.<param>" is expert e of
//   "<…>.mlp.experts.experts.<param>" (a SequentialMLP's experts, each at
//   its global index: expert parallelism only decides which rank saves it).
// The stored key and the indices (layer, then expert); nullopt for a key
// outside the layers.
std::optional<std::pair<std::string, std::vector<int64_t>>> stacked_key(const std::string& key) {
  static const std::string kHead = "decoder.layers.", kExperts = ".experts.local_experts.";
  if (key.rfind(kHead, 0) != 0) return std::nullopt;
  auto layer = index_at(key, kHead.size());
  if (!layer) return std::nullopt;
  std::string rest = key.substr(layer->second + 1);
  std::vector<int64_t> indices = {layer->first};
  if (std::size_t at = rest.find(kExperts); at != std::string::npos)
    if (auto expert = index_at(rest, at + kExperts.size())) {
      indices.push_back(expert->first);
      rest = rest.substr(0, at) + ".experts.experts." + rest.substr(expert->second + 1);
    }
  return std::make_pair(kHead + rest, indices);
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
  // Per stacked key, its slices by (layer[, expert]), in order of first appearance.
  std::vector<std::string> order;
  std::map<std::string, std::map<std::vector<int64_t>, ValuePtr>> stacks;
  std::vector<std::pair<ValuePtr, ValuePtr>> plain;  // outside the layers: tensors as they are
  for (const auto& [k, v] : mapping_of(model.root)->entries) {
    const std::string key = path_component(*k);
    if (auto sk = stacked_key(key)) {
      auto& slices = stacks[sk->first];
      if (slices.empty()) order.push_back(sk->first);
      slices[sk->second] = v;
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
  // The stack's size on each axis (layers; experts), the same for every key
  // stacked on it: megatron-core builds every layer, and every MoE layer
  // with every expert.
  std::vector<int64_t> counts;
  for (const std::string& key : order) {
    const auto& slices = stacks.at(key);
    const std::vector<int64_t>& last = slices.rbegin()->first;
    std::vector<int64_t> dims(last.size());
    for (const auto& [index, v] : slices) {
      if (index.size() != dims.size())
        fail_invalid("--layout megatron: '" + key + "' is stacked on the experts in some layers and not in others");
      for (std::size_t a = 0; a < index.size(); ++a) dims[a] = std::max(dims[a], index[a] + 1);
    }
    for (std::size_t a = 0; a < dims.size(); ++a) {
      if (counts.size() == a) counts.push_back(dims[a]);
      if (dims[a] != counts[a])
        fail_invalid("--layout megatron: '" + key + "' has " + std::to_string(dims[a]) + " " +
                     (a == 0 ? "layers" : "experts") + ", not the " + std::to_string(counts[a]) +
                     " every stacked key needs (a layer or an expert missing?)");
    }
    int64_t grid = 1;
    for (int64_t d : dims) grid *= d;
    if (static_cast<int64_t>(slices.size()) != grid)  // distinct indices within dims: the whole grid, or a hole
      fail_invalid("--layout megatron: '" + key + "' has " + std::to_string(slices.size()) + " of its " +
                   std::to_string(grid) + " layers x experts (one missing?)");
    const bool tensor = tensor_ref_index(*slices.begin()->second).has_value();
    for (const auto& [index, v] : slices)
      if (tensor_ref_index(*v).has_value() != tensor)
        fail_invalid("--layout megatron: '" + key + "' is a tensor in some layers and a value in others");
    // Per layer, its slices (one, or its experts in order).
    std::vector<std::vector<ValuePtr>> layers(static_cast<std::size_t>(dims[0]));
    for (const auto& [index, v] : slices) layers[static_cast<std::size_t>(index[0])].push_back(v);
    if (tensor) {
      // Experts stacked per layer first, then the layers: chunks at (l[, e]).
      std::vector<TensorEntry> per_layer;
      for (const auto& values : layers) {
        std::vector<const TensorEntry*> parts;
        for (const ValuePtr& v : values) parts.push_back(&model.tensors.at(*tensor_ref_index(*v)));
        per_layer.push_back(dims.size() == 1 ? *parts[0] : stack_layers(parts, key, model.source));
        per_layer.back().name = parts[0]->name;  // for a message naming the layer that differs
      }
      std::vector<const TensorEntry*> parts;
      for (const TensorEntry& t : per_layer) parts.push_back(&t);
      root->entries.emplace_back(Value::str(key), make_tensor_ref(out.items.tensors.size()));
      out.items.tensors.push_back(stack_layers(parts, key, model.source));
    } else {
      // A sharded object of shape (layers[, experts]): one item per slice.
      std::vector<ValuePtr> values;
      for (auto& l : layers) values.push_back(dims.size() == 1 ? l[0] : Value::list(std::move(l)));
      add_object_items(key, Value::list(std::move(values)), dims, {}, root);
    }
  }
  out.items.root = root;
  out.side_files = {{"common.pt", empty_common_pt()}, {"metadata.json", kTorchDistMetadata}};
  return out;
}

}  // namespace ckpt::megatron
