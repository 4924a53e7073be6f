#include "model/tree_walk.h"

namespace ckpt {
namespace {
using pickle::Kind;
using pickle::Value;

void walk(const Value& v, const std::string& path, const std::function<void(const Leaf&)>& visit) {
  if (auto idx = tensor_ref_index(v)) {
    visit(Leaf{path, &v, idx});
    return;
  }
  // An OrderedDict with attributes (torch's state_dict `_metadata`) is BUILD over a dict.
  if (v.is(Kind::kBuilt) && v.object && v.object->is(Kind::kDict)) {
    walk(*v.object, path, visit);
    return;
  }
  if (v.is(Kind::kDict)) {
    for (const auto& [key, value] : v.entries) walk(*value, join_path(path, path_component(*key)), visit);
    if (v.entries.empty()) visit(Leaf{path, &v, std::nullopt});
    return;
  }
  if (v.is(Kind::kList) || v.is(Kind::kTuple)) {
    bool has_container = false;
    for (const auto& item : v.items)
      if (item->is(Kind::kDict) || item->is(Kind::kList) || item->is(Kind::kTuple) || tensor_ref_index(*item))
        has_container = true;
    // A list of plain values (param_groups' params, betas) is one leaf.
    if (!has_container) {
      visit(Leaf{path, &v, std::nullopt});
      return;
    }
    for (std::size_t i = 0; i < v.items.size(); ++i) walk(*v.items[i], join_path(path, std::to_string(i)), visit);
    return;
  }
  visit(Leaf{path, &v, std::nullopt});
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

void walk_leaves(const Value& root, const std::function<void(const Leaf&)>& visit) { walk(root, "", visit); }

}  // namespace ckpt
