#include "model/tree_walk.h"

#include <unordered_map>

#include "core/error.h"

namespace ckpt {
namespace {
using pickle::Kind;
using pickle::Value;

std::string key_type(const Value& key) {
  return key.is(Kind::kStr) ? "str" : key.is(Kind::kInt) ? "int" : kind_name(key.kind);
}

std::string deeper(const std::string& structure, const std::string& container) {
  return structure.empty() ? container : structure + " > " + container;
}

// torch names a nested value ".".join(keys) (DCP's flatten_state_dict, the
// DCP-HF writer): an empty key below the top is "model." for {"model": {"": t}},
// not "model" (join_path drops empty components, which names it "model").
std::string child_path(const std::string& path, const std::string& structure, const std::string& component) {
  return structure.empty() ? component : path + "." + component;
}

void walk(const Value& v, const std::string& path, const std::string& structure,
          const std::function<void(const Leaf&)>& visit) {
  if (auto idx = tensor_ref_index(v)) {
    visit(Leaf{path, structure, &v, idx});
    return;
  }
  // An OrderedDict with attributes (torch's state_dict `_metadata`) is BUILD over a dict.
  if (v.is(Kind::kBuilt) && v.object && v.object->is(Kind::kDict)) {
    walk(*v.object, path, structure, visit);
    return;
  }
  if (v.is(Kind::kDict)) {
    for (const auto& [key, value] : v.entries)
      walk(*value, child_path(path, structure, path_component(*key)), deeper(structure, "dict[" + key_type(*key) + "]"),
           visit);
    if (v.entries.empty()) visit(Leaf{path, structure, &v, std::nullopt});
    return;
  }
  if (v.is(Kind::kList) || v.is(Kind::kTuple)) {
    bool has_container = false;
    for (const auto& item : v.items)
      if (item->is(Kind::kDict) || item->is(Kind::kList) || item->is(Kind::kTuple) || tensor_ref_index(*item))
        has_container = true;
    // A list of plain values (param_groups' params, betas) is one leaf.
    if (!has_container) {
      visit(Leaf{path, structure, &v, std::nullopt});
      return;
    }
    for (std::size_t i = 0; i < v.items.size(); ++i)
      walk(*v.items[i], child_path(path, structure, std::to_string(i)), deeper(structure, "list"), visit);
    return;
  }
  visit(Leaf{path, structure, &v, std::nullopt});
}
}  // namespace

std::string path_component(const Value& key) {
  if (key.is(Kind::kStr)) return key.text;
  if (key.is(Kind::kInt)) return std::to_string(key.int_value);
  return key.repr(1);
}

std::string join_path(const std::string& parent, const std::string& component) {
  if (component.empty()) return parent;
  return parent.empty() ? component : parent + "." + component;
}

pickle::ValuePtr mapping_of(const pickle::ValuePtr& v) {
  if (v && v->is(Kind::kBuilt) && v->object && v->object->is(Kind::kDict)) return v->object;
  return v;
}

void require_state_dict(const CheckpointModel& model, const std::string& layout) {
  pickle::ValuePtr root = mapping_of(model.root);
  if (root && root->is(Kind::kDict)) return;
  std::string what = !root                     ? "nothing"
                     : tensor_ref_index(*root) ? "a tensor"
                                               : "a " + std::string(pickle::kind_name(root->kind));
  fail(ErrorCode::kUnimplemented,
       model.source + ": " + layout + " holds a state dict (a dict); this file holds " + what);
}

pickle::ValuePtr value_at_path(const pickle::ValuePtr& root, const std::vector<pickle::ValuePtr>& path,
                               const std::string& key) {
  pickle::ValuePtr cur = root;
  for (const pickle::ValuePtr& element : path) {
    cur = mapping_of(cur);
    pickle::ValuePtr next;
    if (cur->is(Kind::kDict) && element->is(Kind::kStr)) {
      for (const auto& [k, v] : cur->entries)
        if (path_component(*k) == element->text) next = v;  // dcp.save writes every key as str(key)
    } else if (cur->is(Kind::kList) && element->is(Kind::kInt) && element->int_value >= 0 &&
               static_cast<std::size_t>(element->int_value) < cur->items.size()) {
      next = cur->items[static_cast<std::size_t>(element->int_value)];
    }
    if (!next) fail_data_loss("key '" + key + "': its planner_data path leads nowhere in the state dict");
    cur = next;
  }
  return cur;
}

void walk_leaves(const Value& root, const std::function<void(const Leaf&)>& visit) { walk(root, "", "", visit); }

void require_distinct_paths(const Value& root, const std::string& output) {
  std::unordered_map<std::string, std::string> seen;  // path -> the containers it went through
  walk_leaves(root, [&](const Leaf& leaf) {
    auto [it, fresh] = seen.emplace(leaf.path, leaf.structure);
    if (fresh) return;
    const std::string shown = leaf.path.size() > 200 ? leaf.path.substr(0, 200) + "..." : leaf.path;
    fail(ErrorCode::kUnimplemented, "two entries are both named '" + shown + "' as dotted paths (one through " +
                                        it->second + ", the other through " + leaf.structure +
                                        ", e.g. the keys 7 and '7'): " + output +
                                        " names each entry by its path, so one would be lost; refused");
  });
}

}  // namespace ckpt
