#include "model/plain_values.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/budgets.h"
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

// How the walk reached a node: enough to name its dotted path when (and only
// when) it must be refused, so a clean tree costs no string building.
struct Step {
  const Value* value;
  std::size_t parent;  // index into the steps taken; the root is its own parent
  enum { kRoot, kItem, kKey, kValue, kObject, kState } how;
  std::size_t item = 0;        // kItem: its index
  const Value* key = nullptr;  // kValue: its dict key
};

std::string path_of(const std::vector<Step>& steps, std::size_t at) {
  std::vector<std::string> parts;
  for (; steps[at].how != Step::kRoot; at = steps[at].parent) {
    const Step& s = steps[at];
    switch (s.how) {
      case Step::kItem: parts.push_back(std::to_string(s.item)); break;
      case Step::kKey: parts.push_back("<key>"); break;
      case Step::kValue: parts.push_back(path_component(*s.key)); break;
      case Step::kState: parts.push_back("<attributes>"); break;
      default: break;  // a BUILD's object stands where the BUILD does
    }
  }
  std::string path;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) path = join_path(path, *it);
  return path.empty() ? "<root>" : path;
}

}  // namespace

void require_plain_values(const Value& root) {
  std::unordered_set<const Value*> seen;
  std::vector<Step> steps;
  std::vector<Step> pending{{&root, 0, Step::kRoot}};
  while (!pending.empty()) {
    Step cur = pending.back();
    pending.pop_back();
    if (!seen.insert(cur.value).second) continue;
    std::size_t at = steps.size();
    steps.push_back(cur);
    const Value& v = *cur.value;
    if (std::string why = objection(v); !why.empty()) {
      fail(ErrorCode::kUnsafe, "the value at '" + path_of(steps, at) + "' is " + why +
                                   ", not plain data; ckptconv copies only tensors and plain values (numbers, strings, "
                                   "bytes, lists, dicts) into its outputs");
    }
    if (tensor_ref_index(v) || is_scalar_object(v)) continue;
    for (std::size_t i = 0; i < v.items.size(); ++i) pending.push_back({v.items[i].get(), at, Step::kItem, i});
    for (const auto& [key, value] : v.entries) {
      pending.push_back({key.get(), at, Step::kKey});
      pending.push_back({value.get(), at, Step::kValue, 0, key.get()});
    }
    if (v.object) pending.push_back({v.object.get(), at, Step::kObject});
    if (v.state) pending.push_back({v.state.get(), at, Step::kState});
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
  if (!limit) limit = input_budgets().tree_values;
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
                                 "references one subtree from many places): the tree-values budget; " +
                                 budget_hint("tree-values"));
  }
}

}  // namespace ckpt
