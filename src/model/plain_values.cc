#include "model/plain_values.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/checkpoint_model.h"
#include "model/tree_walk.h"

namespace ckpt {
namespace {

using pickle::Kind;
using pickle::Value;

bool is_scalar_object(const Value& v) {
  if (!v.is(Kind::kCall) || !v.callable || v.newobj) return false;
  return v.callable->is_global("torch", "Size") || v.callable->is_global("torch", "device");
}

// Why `v` is not plain data; empty when it is (its children are checked separately).
std::string objection(const Value& v) {
  switch (v.kind) {
    case Kind::kGlobal:
      if (v.text == "torch") return "";
      return "the global " + v.text + "." + v.name;
    case Kind::kCall:
      if (tensor_ref_index(v) || is_scalar_object(v)) return "";
      return "an object made by " + (v.callable && v.callable->is(Kind::kGlobal)
                                         ? v.callable->text + "." + v.callable->name
                                         : std::string("a call"));
    case Kind::kBuilt:
      if (v.object && v.object->is(Kind::kDict) && v.object->ordered && v.state && v.state->is(Kind::kDict)) return "";
      return "an object with state set by BUILD";
    case Kind::kPersId: return "a persistent id that is not a tensor's storage";
    default: return "";
  }
}

struct Pending {
  const Value* value;
  std::string path;
};

}  // namespace

void require_plain_values(const Value& root) {
  std::unordered_set<const Value*> seen;
  std::vector<Pending> pending{{&root, ""}};
  while (!pending.empty()) {
    Pending cur = std::move(pending.back());
    pending.pop_back();
    if (!seen.insert(cur.value).second) continue;
    const Value& v = *cur.value;
    if (std::string why = objection(v); !why.empty()) {
      fail(ErrorCode::kUnsafe, "the value at '" + (cur.path.empty() ? std::string("<root>") : cur.path) + "' is " +
                                   why +
                                   ", not plain data; ckptconv copies only tensors and plain values (numbers, strings, "
                                   "bytes, lists, dicts) into its outputs");
    }
    if (tensor_ref_index(v) || is_scalar_object(v)) continue;
    for (std::size_t i = 0; i < v.items.size(); ++i)
      pending.push_back({v.items[i].get(), join_path(cur.path, std::to_string(i))});
    for (const auto& [key, value] : v.entries) {
      pending.push_back({key.get(), join_path(cur.path, "<key>")});
      pending.push_back({value.get(), join_path(cur.path, path_component(*key))});
    }
    if (v.is(Kind::kBuilt)) {
      pending.push_back({v.object.get(), cur.path});
      pending.push_back({v.state.get(), join_path(cur.path, "<attributes>")});
    }
  }
}

namespace {

// The children a tree walk descends into (a tensor reference is a leaf).
template <class Fn>
void for_each_child(const Value& v, Fn&& fn) {
  if (tensor_ref_index(v) || v.is(Kind::kCall)) return;
  for (const auto& item : v.items) fn(item.get());
  for (const auto& [key, value] : v.entries) {
    fn(key.get());
    fn(value.get());
  }
  if (v.object) fn(v.object.get());
  if (v.state) fn(v.state.get());
}

}  // namespace

void require_bounded_expansion(const Value& root, uint64_t limit) {
  // Post-order over the graph; sizes saturate just above the limit.
  std::unordered_map<const Value*, uint64_t> size;
  std::vector<std::pair<const Value*, bool>> stack{{&root, false}};
  while (!stack.empty()) {
    auto [node, children_done] = stack.back();
    stack.pop_back();
    if (size.count(node)) continue;
    if (!children_done) {
      stack.push_back({node, true});
      for_each_child(*node, [&](const Value* child) {
        if (!size.count(child)) stack.push_back({child, false});
      });
      continue;
    }
    uint64_t total = 1;
    for_each_child(*node, [&](const Value* child) {
      auto it = size.find(child);
      if (it == size.end())
        fail_data_loss("the value tree has a cycle");  // the unpickler refuses cycles; belt and braces
      total = std::min(limit + 1, total + it->second);
    });
    size.emplace(node, total);
  }
  if (size.at(&root) > limit) {
    fail(ErrorCode::kUnsafe, "the checkpoint's value tree expands to more than " + std::to_string(limit) +
                                 " values when each shared part is counted where it appears (a pickle that "
                                 "references one subtree from many places); refusing to walk it");
  }
}

}  // namespace ckpt
