// Final checks of what a pickle built, and the teardown that keeps hostile
// graphs from leaking (cycles) or overflowing the C++ stack (deep chains)
// when shared_ptr destructors recurse. Both walk iteratively.
#include <algorithm>

#include "core/error.h"
#include "pickle/unpickler_machine.h"

namespace ckpt::pickle {

bool holds_values(Kind kind) {
  switch (kind) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kDict:
    case Kind::kSet:
    case Kind::kFrozenSet:
    case Kind::kCall:
    case Kind::kBuilt:
    case Kind::kPersId: return true;
    default: return false;
  }
}

namespace {

// Children of a value by index: the seven single slots, then items, then
// the keys and values of entries. `stored` (a decoded framework object's
// form as the pickle made it) is walked too: it is checked and kept like
// the rest of the result.
constexpr std::size_t kSlots = 7;

std::size_t child_count(const Value& v) { return kSlots + v.items.size() + 2 * v.entries.size(); }

const Value* child_at(const Value& v, std::size_t i) {
  switch (i) {
    case 0: return v.callable.get();
    case 1: return v.args.get();
    case 2: return v.kwargs.get();
    case 3: return v.object.get();
    case 4: return v.state.get();
    case 5: return v.pid.get();
    case 6: return v.stored.get();
    default: break;
  }
  i -= kSlots;
  if (i < v.items.size()) return v.items[i].get();
  i -= v.items.size();
  const auto& entry = v.entries[i / 2];
  return (i % 2 == 0 ? entry.first : entry.second).get();
}

struct Frame {
  const Value* value;
  std::size_t next_child;
  uint64_t height;  // containers on the longest path down from here, this one included
};

}  // namespace

PickleMachine::Heights PickleMachine::check_graph(const Value* root) const {
  // 0 while a value is on the current path (seeing it again is a cycle).
  Heights heights;
  if (root == nullptr || !(holds_values(root->kind) || root->stored)) return heights;
  std::vector<Frame> path;
  auto too_deep = [&] {
    fail_data_loss("pickle value nests containers deeper than " + std::to_string(limits_.max_depth) + " levels");
  };
  heights.emplace(root, 0);
  path.push_back({root, 0, 1});
  while (!path.empty()) {
    Frame& frame = path.back();
    if (frame.next_child == child_count(*frame.value)) {
      uint64_t h = frame.height;
      if (h > limits_.max_depth) too_deep();
      heights[frame.value] = h;
      path.pop_back();
      if (!path.empty()) path.back().height = std::max(path.back().height, h + 1);
      continue;
    }
    const Value* child = child_at(*frame.value, frame.next_child++);
    if (child == nullptr || !(holds_values(child->kind) || child->stored)) continue;
    auto [it, inserted] = heights.try_emplace(child, 0);
    if (!inserted) {
      if (it->second == 0) fail_data_loss("pickle value contains a reference cycle, which no checkpoint has");
      frame.height = std::max(frame.height, it->second + 1);
      continue;
    }
    if (path.size() >= limits_.max_depth) too_deep();
    path.push_back({child, 0, 1});
  }
  return heights;
}

void PickleMachine::cut_children(const Heights& keep) {
  // Every container is in the arena, so cutting a reference never drops the
  // last one to a container: nothing recurses here.
  for (const ValuePtr& v : arena_) {
    if (keep.count(v.get())) continue;
    v->items.clear();
    v->entries.clear();
    v->callable.reset();
    v->args.reset();
    v->kwargs.reset();
    v->object.reset();
    v->state.reset();
    v->pid.reset();
    v->stored.reset();
  }
}

}  // namespace ckpt::pickle
