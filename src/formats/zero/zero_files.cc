#include "formats/zero/zero_files.h"

#include <functional>
#include <set>

#include "core/log.h"
#include "formats/torch_pt/pt_reader.h"
#include "io/byte_source.h"
#include "model/tree_walk.h"
#include "pickle/policy.h"

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
  static const std::set<std::string> kRead = {
      "module",        "buffer_names",  "param_shapes", "frozen_param_shapes",  "frozen_param_fragments",
      "shared_params", "dp_world_size", "ds_version",   "optimizer_state_dict", "param_groups"};
  return kRead.count(key) > 0;
}

// A global of the decoded tree the checkpoint policy allows, or the tensor
// references the decoder put in place of tensor rebuilds.
bool known_global(std::string_view module, std::string_view name) {
  static const ValuePtr ref = make_tensor_ref(0);
  if (module == ref->callable->text && name == ref->callable->name) return true;
  return pickle::checkpoint_policy().allows(module, name);
}

// An entry holding a global the checkpoint policy does not know (a
// script's own object in client_state) is refused naming it, or, when
// `--only` selects an output that does not need it, dropped with a warning.
// Entries this reader uses are always refused.
void screen_unknown_globals(Value& root, const std::string& path, const std::string& only,
                            std::string_view unknown_entries) {
  auto& entries = root.entries;
  for (auto it = entries.begin(); it != entries.end();) {
    std::string global = unknown_global_in(*it->second);
    if (global.empty()) global = unknown_global_in(*it->first);
    if (global.empty()) {
      ++it;
      continue;
    }
    std::string key = path_component(*it->first);
    std::string what =
        path + ": entry '" + key + "' names global '" + global + "', which is not one a checkpoint needs";
    if (is_read_entry(key) || only.empty())
      fail(ErrorCode::kUnsafe,
           what + "; refusing to load it" +
               (is_read_entry(key) ? std::string()
                                   : " (it is " + std::string(unknown_entries) +
                                         ": with --only model or --only optim, which never need it, consolidate, "
                                         "reshard, validate and diff skip it)"));
    log::warn(what + ": skipped, --only " + only + " does not need it");
    it = entries.erase(it);
  }
}

// A flat 1-D partition record: one contiguous chunk.
const TensorChunk& flat_chunk(const TensorEntry& t, const std::string& what) {
  if (t.shape.size() != 1 || t.chunks.size() != 1 || t.chunks[0].strides != Shape{1})
    fail_data_loss(what + " is not a flat 1-D partition");
  return t.chunks[0];
}

}  // namespace

std::string unknown_global_in(const Value& v) { return pickle::first_quarantined_global(v, known_global); }

Decoded decode(const std::string& path, int rank, ProblemSink* problems, const std::string& only,
               std::string_view unknown_entries) {
  Decoded d;
  d.path = path;
  d.rank = rank;
  // Unknown globals are recorded, never called, and screened below before
  // anything reads the tree.
  pickle::QuarantinePolicy quarantine(pickle::checkpoint_policy());
  d.root = torch_pt::decode_archive(open_mapped_source(path), d.tensors, "", rank, problems, quarantine);
  if (!d.root || !d.root->is(Kind::kDict)) {
    std::string global = d.root ? unknown_global_in(*d.root) : "";
    if (!global.empty())
      fail(ErrorCode::kUnsafe,
           path + ": global '" + global + "' is not one a checkpoint needs; refusing to load a pickle that names it");
    fail_data_loss(path + ": not a DeepSpeed state dict");
  }
  screen_unknown_globals(*d.root, path, only, unknown_entries);
  return d;
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

// ---- element ranges into boxes ----

// Adds to `out` the chunks holding its flattened elements [begin, begin+n),
// read from `src` (a flat partition) starting at its element `src_elem`. A
// range of a row-major tensor is at most 2 x ndim boxes: a partial first
// row, whole rows, a partial last row, recursively.
void add_range(TensorEntry& out, const TensorEntry& src, uint64_t src_elem, uint64_t begin, uint64_t n, int rank,
               const std::string& what) {
  if (n == 0) return;
  const TensorChunk& sc = flat_chunk(src, what);
  if (src_elem > uint64_t(src.shape[0]) || n > uint64_t(src.shape[0]) - src_elem)
    fail_data_loss(what + ": needs elements [" + std::to_string(src_elem) + ", " + std::to_string(src_elem + n) +
                   ") of a partition of " + std::to_string(src.shape[0]));
  const Shape strides = contiguous_strides(out.shape);
  const int64_t base = sc.storage_offset + int64_t(src_elem) - int64_t(begin);
  auto emit = [&](const Shape& offsets, const Shape& sizes) {
    TensorChunk c;
    c.offsets = offsets;
    c.sizes = sizes;
    c.storage = sc.storage;
    c.strides = strides;
    int64_t flat = 0;
    for (std::size_t d = 0; d < offsets.size(); ++d) flat += offsets[d] * strides[d];
    c.storage_offset = base + flat;
    c.storage_crc = sc.storage_crc;
    c.record = sc.record;
    c.big_endian = sc.big_endian;
    c.file = sc.file;
    c.rank = rank;
    out.chunks.push_back(std::move(c));
  };
  // Recursive over dimensions: [lo, hi) within the sub-tensor at dim `d`
  // whose leading indices are `prefix`.
  std::function<void(std::size_t, Shape, uint64_t, uint64_t)> split = [&](std::size_t d, Shape prefix, uint64_t lo,
                                                                          uint64_t hi) {
    if (lo >= hi) return;
    const Shape& shape = out.shape;
    if (d == shape.size()) {  // a scalar (0-d tensor)
      emit(prefix, {});
      return;
    }
    uint64_t inner = 1;
    for (std::size_t k = d + 1; k < shape.size(); ++k) inner *= uint64_t(shape[k]);
    Shape rest(shape.begin() + long(d) + 1, shape.end());
    auto box = [&](uint64_t r0, uint64_t r1) {
      Shape offsets = prefix, sizes(d, 1);
      offsets.push_back(int64_t(r0));
      offsets.resize(shape.size(), 0);
      sizes.push_back(int64_t(r1 - r0));
      sizes.insert(sizes.end(), rest.begin(), rest.end());
      emit(offsets, sizes);
    };
    uint64_t r_lo = lo / inner, r_hi = hi / inner;
    auto within = [&](uint64_t row, uint64_t a, uint64_t b) {
      Shape p = prefix;
      p.push_back(int64_t(row));
      split(d + 1, p, a, b);
    };
    if (r_lo == r_hi) {
      within(r_lo, lo % inner, hi % inner);
      return;
    }
    if (lo % inner) within(r_lo++, lo % inner, inner);
    if (r_hi > r_lo) box(r_lo, r_hi);
    if (hi % inner) within(r_hi, 0, hi % inner);
  };
  split(0, {}, begin, begin + n);
}

void add_stage3_fragments(TensorEntry& out, const std::vector<const TensorEntry*>& frags,
                          const std::vector<std::string>& paths) {
  const uint64_t ws = frags.size(), numel = shape_numel(out.shape), part = (numel + ws - 1) / ws;
  for (uint64_t r = 0; r < ws; ++r) {
    uint64_t lo = std::min(numel, r * part), hi = std::min(numel, (r + 1) * part);
    add_range(out, *frags[r], 0, lo, hi - lo, int(r), paths[r] + ": frozen '" + out.name + "'");
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
