#include "formats/zero/zero_files.h"

#include <set>

#include "model/flat_range.h"
#include "model/tree_walk.h"

namespace ckpt::zero {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// The top-level entries of model and optimizer files that this reader uses.
// Every other entry is client_state (DeepSpeed merges the script's
// `client_state` dict into the model file) or engine bookkeeping it does
// not need.
bool is_read_entry(const std::string& key) {
  static const std::set<std::string> kRead = {"module",
                                              "buffer_names",
                                              "param_shapes",
                                              "frozen_param_shapes",
                                              "frozen_param_fragments",
                                              "shared_params",
                                              "dp_world_size",
                                              "ds_version",
                                              "optimizer_state_dict",
                                              "optimizer",
                                              "param_groups",
                                              "universal_checkpoint_info"};
  return kRead.count(key) > 0;
}

}  // namespace

Decoded decode(const std::string& path, int rank, ProblemSink* problems, const std::string& only,
               std::string_view unknown_entries) {
  return torch_pt::decode_quarantined(path, rank, problems, only, is_read_entry, unknown_entries,
                                      "a DeepSpeed state dict");
}

// An OrderedDict with attributes (a module state_dict's _metadata) is BUILD
// on the dict: its entries are the object's.
const Value& as_dict(const Value& v) { return v.is(Kind::kBuilt) && v.object ? *v.object : v; }

ValuePtr at(const Value& v0, std::string_view key, const std::string& file) {
  const Value& v = as_dict(v0);
  ValuePtr out = v.is(Kind::kDict) ? v.get(key) : nullptr;
  if (!out) fail_data_loss(file + ": no '" + std::string(key) + "' entry (not a DeepSpeed ZeRO file?)");
  return out;
}

void add_stage3_fragments(TensorEntry& out, const std::vector<const TensorEntry*>& frags,
                          const std::vector<std::string>& paths) {
  const uint64_t ws = frags.size(), numel = shape_numel(out.shape), part = (numel + ws - 1) / ws;
  for (uint64_t r = 0; r < ws; ++r) {
    uint64_t lo = std::min(numel, r * part), hi = std::min(numel, (r + 1) * part);
    add_flat_range(out, *frags[r], 0, lo, hi - lo, int(r), paths[r] + ": frozen '" + out.name + "'");
  }
}

std::size_t copy_tensor(CheckpointModel& model, const Decoded& d, const Value& ref, const std::string& name) {
  TensorEntry t = d.tensor(ref, d.path + ": '" + name + "'");
  t.name = name;
  model.tensors.push_back(std::move(t));
  return model.tensors.size() - 1;
}

namespace {

// `v` of file `d` as a value of `model`: its tensors copied into the
// model (named by where they sit), shared subtrees kept shared.
ValuePtr carry(CheckpointModel& model, const Decoded& d, const Value& v, const std::string& path,
               std::map<const Value*, ValuePtr>& carried, int depth) {
  if (auto it = carried.find(&v); it != carried.end()) return it->second;
  if (depth > 256) fail_data_loss(d.path + ": '" + path + "' nests more than 256 levels deep");
  ValuePtr out;
  if (tensor_ref_index(v)) {
    out = make_tensor_ref(copy_tensor(model, d, v, path));
  } else {
    out = std::make_shared<Value>(v);
    for (auto& item : out->items) item = carry(model, d, *item, path, carried, depth + 1);
    for (auto& [key, value] : out->entries)
      value = carry(model, d, *value, join_path(path, path_component(*key)), carried, depth + 1);
    if (out->object) out->object = carry(model, d, *out->object, path, carried, depth + 1);
    if (out->state) out->state = carry(model, d, *out->state, path, carried, depth + 1);
  }
  carried.emplace(&v, out);
  return out;
}

}  // namespace

// What a job needs besides weights and optimizer state to resume its
// schedule, from the model-states file (rank 0's), under DeepSpeed's own
// names: lr_scheduler (the scheduler's state_dict()), global_steps,
// global_samples, skipped_steps, and client_state (the entries the script
// passed to save_checkpoint(client_state=...), which DeepSpeed merges into
// the file's top level). Plain data only: entries holding an object the
// allow-list does not know were refused or dropped when decoded.
void add_training_state(CheckpointModel& model, const Decoded& m0) {
  static const std::set<std::string> kEngine = {"module",
                                                "buffer_names",
                                                "optimizer",
                                                "param_shapes",
                                                "frozen_param_shapes",
                                                "shared_params",
                                                "frozen_param_fragments",
                                                "lr_scheduler",
                                                "data_sampler",
                                                "random_ltd",
                                                "sparse_tensor_module_names",
                                                "skipped_steps",
                                                "global_steps",
                                                "global_samples",
                                                "dp_world_size",
                                                "mp_world_size",
                                                "ds_config",
                                                "ds_version",
                                                "checkpoint_parallel_dimensions",
                                                "universal_checkpoint_info",
                                                "zero_stage"};
  std::map<const Value*, ValuePtr> carried;
  auto add = [&](const std::string& key, const Value& v) {
    model.root->entries.emplace_back(Value::str(key), carry(model, m0, v, key, carried, 0));
  };
  if (ValuePtr s = m0.root->get("lr_scheduler"); s && !s->is(Kind::kNone)) add("lr_scheduler", *s);
  for (const char* key : {"global_steps", "global_samples", "skipped_steps"})
    if (ValuePtr v = m0.root->get(key); v && v->is(Kind::kInt)) add(key, *v);
  auto client = Value::dict();
  for (const auto& [k, v] : m0.root->entries)
    if (!k->is(Kind::kStr) || !kEngine.count(k->text)) client->entries.emplace_back(k, v);
  if (!client->entries.empty()) add("client_state", *client);
}

}  // namespace ckpt::zero
