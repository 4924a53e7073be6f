#include "formats/megatron/megatron_writer.h"

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/paths.h"
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

}  // namespace ckpt::megatron
