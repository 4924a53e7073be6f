#include "plan/select.h"

#include <functional>
#include <optional>

#include "core/error.h"
#include "core/linear_regex.h"
#include "model/tree_walk.h"

namespace ckpt {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

class Selector {
 public:
  Selector(const CheckpointModel& in, CheckpointModel& out, const std::string& keys, bool exclude_frozen)
      : in_(in), out_(out), exclude_frozen_(exclude_frozen) {
    if (!keys.empty()) {
      try {
        keys_ = LinearRegex::compile(keys);
      } catch (const Error& e) {
        fail_invalid("--keys '" + keys + "' is not a valid regular expression: " + e.message());
      }
    }
  }

  // The filtered copy of v, or nullptr when nothing under it is selected.
  ValuePtr filter(const ValuePtr& v, const std::string& path, bool top) {
    if (v->is(Kind::kBuilt) && v->object && v->object->is(Kind::kDict)) {
      ValuePtr inner = filter(v->object, path, top);
      return inner ? Value::built(inner, v->state) : nullptr;
    }
    if (v->is(Kind::kDict)) {
      auto out = Value::dict({}, v->ordered);
      for (const auto& [key, child] : v->entries) {
        std::string component = path_component(*key);
        if (ValuePtr kept = filter(child, join_path(path, component), false)) out->entries.emplace_back(key, kept);
      }
      if (out->entries.empty() && !(top && v->entries.empty())) return nullptr;
      return out;
    }
    if (auto idx = tensor_ref_index(*v); idx && exclude_frozen_ && in_.tensors[*idx].frozen) return nullptr;
    bool any = false;
    walk_leaves(*v, [&](const Leaf& leaf) { any = any || matches(join_path(path, leaf.path)); });
    if (!any) return nullptr;
    return copy_with_tensors(v);
  }

 private:
  bool matches(const std::string& path) const { return !keys_ || keys_->search(path); }

  // Copies a kept subtree, moving its tensors to the output model.
  ValuePtr copy_with_tensors(const ValuePtr& v) {
    if (auto idx = tensor_ref_index(*v)) {
      auto it = renumbered_.find(*idx);
      if (it == renumbered_.end()) {
        out_.tensors.push_back(in_.tensors[*idx]);
        it = renumbered_.emplace(*idx, make_tensor_ref(out_.tensors.size() - 1)).first;
      }
      return it->second;
    }
    if (!(v->is(Kind::kDict) || v->is(Kind::kList) || v->is(Kind::kTuple))) return v;
    auto out = std::make_shared<Value>(*v);
    for (auto& item : out->items) item = copy_with_tensors(item);
    for (auto& [key, child] : out->entries) child = copy_with_tensors(child);
    return out;
  }

  const CheckpointModel& in_;
  CheckpointModel& out_;
  std::optional<LinearRegex> keys_;
  bool exclude_frozen_;
  std::map<std::size_t, ValuePtr> renumbered_;
};

bool is_step_counter(const std::string& name) {
  return name == "step" || (name.size() > 5 && name.compare(name.size() - 5, 5, ".step") == 0);
}

}  // namespace

namespace {

// The top-level keys --only NAME selects: DCP saves name the optimizer
// "optim" (torch's examples), "optimizer" (torchtitan, Accelerate) or
// "optimizer_0" (Lightning, numbering its optimizers: only when it has one).
bool names_part(const std::string& key, const std::string& only, bool several_optimizers) {
  return key == only || (only == "optim" && (key == "optimizer" || (key == "optimizer_0" && !several_optimizers)));
}

// --only NAME: the subtree under the top-level key NAME becomes the root,
// as model.state_dict() / optimizer.state_dict() name their keys (the rank
// file and ZeRO readers return it so already).
CheckpointModel reroot(const CheckpointModel& model, const std::string& only, std::string& key_name) {
  ValuePtr root = mapping_of(model.root);
  std::string keys;
  bool several = root->is(Kind::kDict) && root->get("optimizer_1") != nullptr;
  if (root->is(Kind::kDict))
    for (const auto& [key, child] : root->entries) {
      std::string name = path_component(*key);
      if (names_part(name, only, several)) {
        CheckpointModel part;
        part.info = model.info;
        part.source = model.source;
        part.facts = model.facts;
        part.tensors = model.tensors;
        part.root = child;
        key_name = name;
        // Tensor names are paths: they lose the prefix the keys lost.
        std::string prefix = name + ".";
        for (auto& t : part.tensors)
          if (t.name.rfind(prefix, 0) == 0) t.name.erase(0, prefix.size());
        return part;  // its unreferenced tensors go when it is selected
      }
      keys += (keys.empty() ? "" : ", ") + name;
    }
  fail_invalid(model.source + ": --only " + only + ": the checkpoint has no top-level '" + only + "'" +
               (only == "optim" ? ", 'optimizer' or (one) 'optimizer_0'" : "") + " entry" +
               (keys.empty() ? "" : " (its top-level keys: " + keys + ")"));
}

}  // namespace

CheckpointModel select_entries(const CheckpointModel& model, const SelectOptions& options) {
  if (!options.only.empty() && options.only != "model" && options.only != "optim")
    fail_invalid("--only must be 'model' or 'optim', not '" + options.only + "'");
  if (options.only.empty() && options.keys.empty() && !options.exclude_frozen) return model;
  std::optional<CheckpointModel> part;
  std::string key;
  if (!options.only.empty()) part = reroot(model, options.only, key);
  const CheckpointModel& in = part ? *part : model;
  CheckpointModel out;
  out.info = in.info;
  out.source = in.source;
  out.facts = in.facts;
  Selector selector(in, out, options.keys, options.exclude_frozen);
  out.root = selector.filter(in.root, "", true);
  if (!out.root || (out.root->is(Kind::kDict) && out.root->entries.empty()))
    fail_invalid(model.source + ": no entries match the selection" +
                 (options.only.empty() ? "" : " --only " + options.only) +
                 (options.keys.empty() ? "" : " --keys '" + options.keys + "'") +
                 (options.exclude_frozen ? " --exclude-frozen" : ""));
  if (part && options.keep_nesting) {  // back under its key, as the job saved it
    out.root = Value::dict({{Value::str(key), out.root}});
    for (auto& t : out.tensors) t.name = key + "." + t.name;
  }
  return out;
}

std::vector<bool> optimizer_state_tensors(const CheckpointModel& model) {
  std::vector<bool> out(model.tensors.size(), false);
  ValuePtr root = model.root ? mapping_of(model.root) : nullptr;
  if (!root || !root->is(Kind::kDict)) return out;
  auto mark = [&](const Value& v) {
    walk_leaves(v, [&](const Leaf& leaf) {
      if (leaf.tensor) out.at(*leaf.tensor) = true;
    });
  };
  // An optimizer.state_dict() is a dict of "state" and "param_groups",
  // whatever key holds it: PyTorch's tutorial saves it as
  // "optimizer_state_dict", Lightning's full checkpoint in the list
  // "optimizer_states". Found by that shape, anywhere in the tree.
  std::function<void(const ValuePtr&)> find_state_dicts = [&](const ValuePtr& v) {
    ValuePtr d = mapping_of(v);
    if (d->is(Kind::kDict)) {
      if (d->get("state") && d->get("param_groups")) return mark(*d);
      for (const auto& entry : d->entries) find_state_dicts(entry.second);
    } else if (d->is(Kind::kList) || d->is(Kind::kTuple)) {
      for (const auto& item : d->items) find_state_dicts(item);
    }
  };
  find_state_dicts(root);
  const bool several = root->get("optimizer_1") != nullptr;
  for (const auto& [key, child] : root->entries) {
    const std::string name = path_component(*key);
    const bool numbered = name.rfind("optimizer_", 0) == 0 && name.size() > 10 &&
                          name.find_first_not_of("0123456789", 10) == std::string::npos;
    if (names_part(name, "optim", several) || numbered || name.rfind("optimizer.", 0) == 0 ||
        name.rfind("optim.", 0) == 0)
      mark(*child);
  }
  return out;
}

CastCounts apply_cast(CheckpointModel& model, std::optional<DType> model_to, std::optional<DType> optim_to) {
  CastCounts n;
  const std::vector<bool> optim = optimizer_state_tensors(model);
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    TensorEntry& t = model.tensors[i];
    n.packed_kept += t.dtype == DType::kFloat4E2M1FNx2;
    if (!dtype_info(t.dtype).is_floating || is_step_counter(t.name)) continue;
    const std::optional<DType>& to = optim[i] ? optim_to : model_to;
    if (to) t.out_dtype = *to;
    if (optim[i])
      ++(to ? n.optim_cast : n.optim_kept);
    else if (to)
      ++n.model_cast;
  }
  return n;
}

std::optional<DType> parse_dtype_option(const std::string& text) {
  if (text == "keep" || text.empty()) return std::nullopt;
  // ckptconv's short names and torch's own (as inspect prints them).
  if (text == "fp32" || text == "float32" || text == "float") return DType::kFloat32;
  if (text == "bf16" || text == "bfloat16") return DType::kBFloat16;
  if (text == "fp16" || text == "float16" || text == "half") return DType::kFloat16;
  // float8 as safetensors' F8_E4M3 / F8_E5M2 hold it (cast by LibTorch: Tensor.to's rounding and range).
  if (text == "fp8_e4m3" || text == "float8_e4m3fn") return DType::kFloat8E4M3FN;
  if (text == "fp8_e5m2" || text == "float8_e5m2") return DType::kFloat8E5M2;
  fail_invalid(
      "--dtype must be keep, fp32 (float32, float), bf16 (bfloat16), fp16 (float16, half), fp8_e4m3 "
      "(float8_e4m3fn) or fp8_e5m2 (float8_e5m2), not '" +
      text + "'");
}

}  // namespace ckpt
