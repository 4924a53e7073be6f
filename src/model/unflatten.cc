#include "model/unflatten.h"

#include "core/error.h"

namespace ckpt {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr int64_t kMaxListIndex = 1 << 24;  // a path index beyond this is corrupt metadata

}  // namespace

// The slot that path element `key` names inside `container`, created empty.
// Dict keys are found through an index per dict (a flat DCP state dict of
// 100,000 keys was 5 x 10^9 string compares by scanning: 100 s to inspect).
ValuePtr& Unflattener::slot_for(Value& container, const Value& key) {
  if (container.is(Kind::kDict)) {
    if (!key.is(Kind::kStr)) fail_data_loss("path element " + key.repr(1) + " indexes a dict but is not a string");
    auto& index = keys_[&container];
    auto [it, fresh] = index.try_emplace(key.text, container.entries.size());
    if (fresh) container.entries.emplace_back(Value::str(key.text), nullptr);
    return container.entries[it->second].second;
  }
  if (container.is(Kind::kList)) {
    if (!key.is(Kind::kInt) || key.int_value < 0 || key.int_value > kMaxListIndex)
      fail_data_loss("path element " + key.repr(1) + " indexes a list but is not a valid index");
    auto idx = static_cast<std::size_t>(key.int_value);
    while (container.items.size() <= idx) container.items.push_back(Value::none());
    return container.items[idx];
  }
  fail_data_loss("path goes through a " + std::string(pickle::kind_name(container.kind)) + ", not a dict or list");
}

void Unflattener::set(const std::vector<ValuePtr>& path, ValuePtr value) {
  if (path.empty()) fail_data_loss("empty object path in planner_data");
  Value* cur = root_.get();
  for (std::size_t i = 1; i < path.size(); ++i) {
    ValuePtr& slot = slot_for(*cur, *path[i - 1]);
    if (!slot || slot->is(Kind::kNone)) {
      slot = path[i]->is(Kind::kStr) ? Value::dict() : Value::list({});
      made_.push_back(slot);  // alive while indexed, even if a later path overwrites its slot
    }
    cur = slot.get();
  }
  slot_for(*cur, *path.back()) = std::move(value);
}

}  // namespace ckpt
