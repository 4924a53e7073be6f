#include "formats/megatron/megatron_reader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/linear_regex.h"
#include "core/log.h"
#include "formats/dcp/dcp_reader.h"
#include "formats/torch_pt/quarantined_pt.h"
#include "io/byte_source.h"
#include "io/storage.h"
#include "model/ordered_json.h"
#include "model/tree_walk.h"
#include "pickle/framework_objects.h"
#include "pickle/policy.h"

namespace ckpt::megatron {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr const char* kMetadataJson = "metadata.json";
constexpr const char* kCommonFile = "common.pt";
// metadata.json holds four short fields; anything near this is not one.
constexpr uint64_t kMaxMetadataJson = 1 << 20;
// The optimizer's entries: optimizer.state.<kind>.<model key>
// (fully_reshardable) or optimizer.distributed.… (dp_reshardable), each
// under chained_<i>. when the optimizer is a ChainedOptimizer of several
// (MoE: one for the dense parameters, one for the experts).
constexpr std::string_view kOptimizerState = "optimizer.state.";
constexpr std::string_view kOptimizerBuckets = "optimizer.distributed.";

// `key` without its chained_<i>. prefix; the whole key when it has none.
std::string_view unchained(std::string_view key) {
  if (key.rfind("chained_", 0) != 0) return key;
  std::size_t i = 8;
  while (i < key.size() && std::isdigit(static_cast<unsigned char>(key[i]))) ++i;
  return i > 8 && i < key.size() && key[i] == '.' ? key.substr(i + 1) : key;
}

bool is_optimizer_key(std::string_view key) { return unchained(key).rfind("optimizer.", 0) == 0; }

// optimizer.state.<kind>.<model key>: {kind, model key}; empty when not one.
std::pair<std::string, std::string> optimizer_state_key(std::string_view key) {
  std::string_view k = unchained(key);
  if (k.rfind(kOptimizerState, 0) != 0) return {};
  std::size_t dot = k.find('.', kOptimizerState.size());
  if (dot == std::string_view::npos) return {};
  return {std::string(k.substr(kOptimizerState.size(), dot - kOptimizerState.size())), std::string(k.substr(dot + 1))};
}

nlohmann::ordered_json read_metadata_json(const std::string& dir) {
  std::string path = (fs::path(dir) / kMetadataJson).string();
  SourcePtr src = open_mapped_source(path);
  if (src->size() > kMaxMetadataJson)
    fail_data_loss(path + ": " + std::to_string(src->size()) + " bytes, not megatron-core's metadata.json");
  nlohmann::ordered_json j = parse_checkpoint_json(src->read_string(0, src->size()), path);
  const nlohmann::ordered_json* backend = j.is_object() ? JsonMembers(j, path).find("sharded_backend") : nullptr;
  if (!backend || !backend->is_string())
    fail_data_loss(path + ": no \"sharded_backend\" string (not megatron-core's metadata.json)");
  return j;
}

// Splitting stacks costs memory per slice made (a piece, then a tensor
// entry and its name: ~1 KB), whatever the stored bytes: a zstd record of
// 4 KB can claim a [10^6, 1] stack. No model has more than a few hundred
// layers or experts, nor more than 10^5 tensors per view, so the splits
// stop well before they cost more than the default --memory-limit.
constexpr int64_t kMaxStackSlices = int64_t{1} << 14;
constexpr uint64_t kMaxPieces = uint64_t{1} << 18;

}  // namespace

std::optional<ObjectShard> parse_object_key(const std::string& item) {
  static const LinearRegex kShard = LinearRegex::compile(R"((.+)/shard_(\d+(?:\.\d+)*)_(\d+(?:\.\d+)*))");
  RegexMatch m;
  if (!kShard.match(item, m)) return std::nullopt;
  const std::string shown = item.size() > 200 ? item.substr(0, 200) + "..." : item;  // keys may be 40k long
  auto ints = [&](const std::string& text) {
    Shape out;
    std::size_t pos = 0;
    while (pos <= text.size()) {
      std::size_t dot = text.find('.', pos);
      std::string part = text.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
      if (part.size() > 12)
        fail_data_loss("sharded object '" + shown + "': an offset or extent of more than 12 digits (" +
                       part.substr(0, 20) + (part.size() > 20 ? "...)" : ")"));
      out.push_back(std::stoll(part));
      if (dot == std::string::npos) break;
      pos = dot + 1;
    }
    return out;
  };
  ObjectShard s{m.str(1), ints(m.str(2)), ints(m.str(3))};
  if (s.shape.size() > kMaxObjectRank)
    fail_data_loss("sharded object '" + shown + "': a " + std::to_string(s.shape.size()) +
                   "-d shape; megatron-core's objects have at most " + std::to_string(kMaxObjectRank) + " axes");
  if (s.offsets.size() != s.shape.size())
    fail_data_loss("sharded object '" + shown + "': " + std::to_string(s.offsets.size()) + " offsets for a " +
                   std::to_string(s.shape.size()) + "-d shape");
  for (std::size_t d = 0; d < s.shape.size(); ++d)
    if (s.offsets[d] >= s.shape[d])
      fail_data_loss("sharded object '" + shown + "': offset " + std::to_string(s.offsets[d]) + " outside its shape " +
                     shape_str(s.shape));
  return s;
}

namespace {

// One sharded object: its shards' values by offset.
struct ObjectGroup {
  Shape shape;
  std::map<Shape, ValuePtr> shards;
};

// The stored items in order: a tensor or byte item, or a sharded object
// (at the place of its first shard).
struct Entry {
  std::string key;
  ValuePtr value;  // tensor reference or decoded bytes item
  const ObjectGroup* object = nullptr;
};

// Up to `limit` offsets of `shape` (row-major) that `present` lacks. The
// walk stops there, so a hostile shape of 10^12 costs what its stored
// shards and `limit` do, never its extent.
template <typename Present>
std::vector<Shape> missing_offsets(const Shape& shape, Present present, std::size_t limit) {
  std::vector<Shape> out;
  Shape idx(shape.size(), 0);
  const uint64_t n = shape_numel(shape);
  for (uint64_t k = 0; k < n && out.size() < limit; ++k) {
    if (!present(idx)) out.push_back(idx);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// The object's value at `prefix` (an offset, or the leading part of one):
// the shard itself, or the nested lists of the shards under it. Only
// complete objects get here (check_objects).
ValuePtr object_value(const ObjectGroup& g, Shape prefix = {}) {
  if (prefix.size() == g.shape.size()) return g.shards.at(prefix);
  std::vector<ValuePtr> items;
  for (int64_t i = 0; i < g.shape[prefix.size()]; ++i) {
    Shape at = prefix;
    at.push_back(i);
    items.push_back(object_value(g, std::move(at)));
  }
  return Value::list(std::move(items));
}

// Where a stored key is stacked on its next axis, and the names its
// slices take. megatron-core stacks
//   - the layers of a TransformerBlock: `decoder.layers.<param>` is
//     [num_layers, ...]; slice i is `decoder.layers.<i>.<param>`;
//   - the experts of a SequentialMLP (MoE): `…mlp.experts.experts.<param>`
//     is [num_experts, ...] once the layer is taken; slice e is
//     `…mlp.experts.local_experts.<e>.<param>`, the module's own name.
// `head` identifies the stack (every key under it must have the same
// count); none: the key is not stacked (any more).
struct Stack {
  std::string head;          // "decoder.layers.", "decoder.layers.0.mlp.experts."
  std::string rest;          // what follows the stack's marker
  std::string slice_marker;  // "" (layers) or "local_experts." (experts)
  std::string name(int64_t i) const { return head + slice_marker + std::to_string(i) + "." + rest; }
};

std::optional<Stack> stack_of(const std::string& key) {
  std::optional<Stack> best;
  std::size_t at = std::string::npos;
  for (std::size_t pos = 0; (pos = key.find("layers.", pos)) != std::string::npos; pos += 7) {
    std::size_t next = pos + 7;
    if ((pos == 0 || key[pos - 1] == '.') && next < key.size() &&
        !std::isdigit(static_cast<unsigned char>(key[next]))) {
      best = Stack{key.substr(0, next), key.substr(next), ""};
      at = pos;
      break;
    }
  }
  if (std::size_t pos = key.find("experts.experts.");
      pos != std::string::npos && pos < at && (pos == 0 || key[pos - 1] == '.'))
    best = Stack{key.substr(0, pos + 8), key.substr(pos + 16), "local_experts."};
  return best;
}

// Slice `layer` of a tensor stacked on its leading axis: the chunks that
// hold it, each narrowed to that index.
TensorEntry layer_of(const TensorEntry& t, int64_t layer, std::string name) {
  TensorEntry out = t;
  out.name = std::move(name);
  out.shape.assign(t.shape.begin() + 1, t.shape.end());
  out.chunks.clear();
  for (const TensorChunk& c : t.chunks) {
    if (layer < c.offsets[0] || layer >= c.offsets[0] + c.sizes[0]) continue;
    TensorChunk n = c;
    n.offsets.assign(c.offsets.begin() + 1, c.offsets.end());
    n.sizes.assign(c.sizes.begin() + 1, c.sizes.end());
    n.strides.assign(c.strides.begin() + 1, c.strides.end());
    n.storage_offset = c.storage_offset + (layer - c.offsets[0]) * c.strides[0];
    out.chunks.push_back(std::move(n));
  }
  return out;
}

// megatron-core loads through the strategy registered for (backend,
// version): ('torch_dist', 1) for the sharded part, ('torch', 1) for
// common.pt; any other pair is "Cannot find a default strategy" there, so
// it is refused here rather than read as version 1. An absent field is
// its dataclass default (those same values).
void require_known_backends(const nlohmann::ordered_json& meta, const std::string& path) {
  const std::pair<const char*, nlohmann::ordered_json> known[] = {
      {"sharded_backend_version", 1}, {"common_backend", "torch"}, {"common_backend_version", 1}};
  for (const auto& [field, value] : known) {
    auto it = meta.find(field);
    if (it != meta.end() && *it != value)
      fail(ErrorCode::kUnimplemented, path + ": " + field + " " + it->dump() + ", where megatron-core loads " +
                                          value.dump() + " only (it has no load strategy for another)");
  }
}

class TorchDistReader {
 public:
  TorchDistReader(std::string dir, ProblemSink* sink, std::string only)
      : dir_(std::move(dir)), sink_(sink), only_(std::move(only)) {}

  CheckpointModel read() {
    nlohmann::ordered_json meta = read_metadata_json(dir_);
    const std::string backend = meta["sharded_backend"].get<std::string>();
    if (backend != "torch_dist")
      fail(ErrorCode::kUnimplemented, dir_ + "/" + kMetadataJson + ": sharded_backend '" + backend +
                                          "'; ckptconv reads megatron-core's 'torch_dist' checkpoints only");
    require_known_backends(meta, dir_ + "/" + kMetadataJson);
    // Sharded objects are the job's state too (Megatron-LM's rng_state holds
    // numpy's, read as data: docs/pickle-globals.md): other globals are
    // recorded, never called, and screened below.
    pickle::QuarantinePolicy quarantine(pickle::checkpoint_policy());
    CheckpointModel model = dcp::read_dcp_dir(dir_, sink_, quarantine);
    model.info.kind = SourceKind::kMegatron;
    for (const char* field : {"sharded_backend_version", "common_backend", "common_backend_version"})
      if (meta.contains(field)) model.facts[std::string("megatron ") + field] = meta[field].dump();
    model.info.files.push_back((fs::path(dir_) / kMetadataJson).string());
    // The ranks that wrote files: of a job with data parallelism, only one
    // replica of each shard writes it, so the job was at least this large.
    if (auto ws = model.facts.find("world_size"); ws != model.facts.end())
      ws->second = "≥ " + ws->second + " (the ranks that wrote files; data-parallel replicas write none)";
    split_items(model);
    screen_unknown_globals();
    check_objects();
    ValuePtr common = read_common(model);
    // The views regroup the DCP items: not the directory's own item layout.
    model.info.flat_layout.reset();
    if (only_.empty()) {
      model.root = stored_view(common, model.info);
    } else {
      auto root = Value::dict();
      root->entries.emplace_back(Value::str("model"), model_view(model));
      if (only_ == "optim") root->entries.emplace_back(Value::str("optim"), optim_view(model, common));
      model.root = root;
      prune_unreferenced(model.root, model.tensors);
    }
    std::sort(model.info.files.begin(), model.info.files.end());
    return model;
  }

 private:
  // The DCP items, sharded objects grouped back under their key.
  void split_items(const CheckpointModel& model) {
    ValuePtr root = mapping_of(model.root);
    for (const auto& [k, v] : root->entries) {
      std::string key = path_component(*k);
      std::optional<ObjectShard> shard = with_context(dir_, [&] { return parse_object_key(key); });
      if (!shard) {
        entries_.push_back({key, v});
        continue;
      }
      auto [it, fresh] = objects_.try_emplace(shard->key);
      ObjectGroup& g = it->second;
      if (fresh) {
        g.shape = shard->shape;
        entries_.push_back({shard->key, nullptr, &g});
      } else if (g.shape != shard->shape) {
        fail_data_loss(dir_ + ": sharded object '" + shard->key + "' has shards of shapes " + shape_str(g.shape) +
                       " and " + shape_str(shard->shape));
      }
      // torch.save([obj]): the objects of this key on the rank that wrote
      // the item, one for a ShardedObject (strategies/torch.py).
      ValuePtr list = mapping_of(v);
      if (!list->is(Kind::kList) || list->items.size() != 1)
        fail_data_loss(dir_ + ": sharded object item '" + key +
                       "' is not a list of one object, as megatron-core "
                       "saves each shard");
      g.shards[shard->offsets] = list->items[0];
    }
    for (const Entry& e : entries_)
      if (!e.object && objects_.count(e.key))
        fail_data_loss(dir_ + ": '" + e.key + "' is both a stored item and a sharded object's key");
  }

  // An item or object naming a global the checkpoint policy does not know
  // (a job's own class in its state) is refused naming it, or, when
  // --only selects a view that does not hold it, dropped with a warning;
  // validate reports it and reads on.
  void screen_unknown_globals() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      std::string global;
      if (it->object) {
        for (const auto& [at, v] : it->object->shards)
          if (global.empty()) global = torch_pt::unknown_global_in(*v);
      } else if (it->value) {
        global = torch_pt::unknown_global_in(*it->value);
      }
      if (global.empty()) {
        ++it;
        continue;
      }
      std::string what =
          dir_ + ": '" + it->key + "' names global '" + global + "', which is not one a checkpoint needs";
      bool needed = only_.empty() || (only_ == "model" && is_model_entry(*it));
      if (needed) {
        report_or_fail(sink_, Problem{ErrorCode::kUnsafe,
                                      what +
                                          "; refusing to load it (it is the training job's own state: "
                                          "--only model or --only optim, which never need it, skip it)" +
                                          pickle::allow_global_hint(global),
                                      dir_ + "/.metadata", -1, it->key});
      } else {
        log::warn(what + ": skipped, --only " + only_ + " does not need it");
      }
      if (it->object) objects_.erase(it->key);
      it = entries_.erase(it);
    }
  }

  // Every shard of every object is stored (the DCP reader checks tensors).
  // Under validate an incomplete object is reported and left out.
  void check_objects() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      const ObjectGroup* g = it->object;
      if (!g || g->shards.size() == shape_numel(g->shape)) {
        ++it;
        continue;
      }
      std::vector<Shape> missing = missing_offsets(
          g->shape, [&](const Shape& at) { return g->shards.count(at) > 0; }, 6);
      std::string listed;
      for (std::size_t i = 0; i < missing.size() && i < 5; ++i) listed += (i ? ", " : "") + shape_str(missing[i]);
      report_or_fail(
          sink_,
          Problem{ErrorCode::kDataLoss,
                  dir_ + ": sharded object '" + it->key + "' of shape " + shape_str(g->shape) + ": " +
                      std::to_string(g->shards.size()) + " of its " + std::to_string(shape_numel(g->shape)) +
                      " shards are stored and readable; missing: " + listed + (missing.size() > 5 ? ", ..." : ""),
                  dir_ + "/.metadata", -1, it->key});
      objects_.erase(it->key);
      it = entries_.erase(it);
    }
  }

  // common.pt: what every rank held alike (iteration, the optimizer's
  // param_groups, a Megatron-LM job's args). A training script's own
  // objects in it are quarantined like DeepSpeed's client_state.
  ValuePtr read_common(CheckpointModel& model) {
    fs::path path = fs::path(dir_) / kCommonFile;
    if (!is_regular_file(path.string())) return nullptr;
    // Of common.pt this reader uses the optimizer's param_groups (--only optim).
    torch_pt::QuarantinedPt d = torch_pt::decode_quarantined(
        path.string(), -1, sink_, only_,
        [this](const std::string& key) { return only_ == "optim" && key == "optimizer"; },
        "the training job's own state in common.pt", "a state dict (megatron-core's common.pt)");
    model.info.files.push_back(path.string());
    CheckpointModel part;
    part.root = d.root;
    part.tensors = std::move(d.tensors);
    return adopt(model, std::move(part));
  }

  ValuePtr stored_view(const ValuePtr& common, SourceInfo& info) {
    auto root = Value::dict();
    std::set<std::string> keys;
    MegatronLayout layout;
    for (const Entry& e : entries_) {
      keys.insert(e.key);
      root->entries.emplace_back(Value::str(e.key), e.object ? object_value(*e.object) : e.value);
      if (e.object) layout.objects.emplace_back(e.key, e.object->shape);
    }
    if (common) {
      ValuePtr c = mapping_of(common);
      if (!c->is(Kind::kDict)) fail_data_loss(dir_ + "/" + kCommonFile + ": not a dict of common state");
      for (const auto& entry : c->entries) {
        std::string key = path_component(*entry.first);
        if (keys.count(key))
          fail_data_loss(dir_ + "/" + kCommonFile + ": entry '" + key + "' is also a sharded key of the checkpoint");
        root->entries.push_back(entry);
        layout.common_keys.push_back(key);
      }
    }
    info.megatron = std::move(layout);
    return root;
  }

  static bool is_model_entry(const Entry& e) {
    if (is_optimizer_key(e.key)) return false;
    // Objects: a module's _extra_state belongs to the model; others
    // (rng_state, a rerun state machine's) to the job.
    return !e.object || (e.key.size() >= 13 && e.key.compare(e.key.size() - 13, 13, "._extra_state") == 0);
  }

  // One value of the output: an entry, sliced at `index` along its
  // leading axes, under `name` (its model key, indices put in).
  struct Piece {
    const Entry* entry;
    std::string name;
    std::vector<int64_t> index;
  };

  // How many slices the next stacked axis of `p` has; -1: none.
  int64_t stack_count(const CheckpointModel& model, const Piece& p) const {
    std::size_t axis = p.index.size();
    if (p.entry->object) return axis < p.entry->object->shape.size() ? p.entry->object->shape[axis] : -1;
    auto idx = tensor_ref_index(*p.entry->value);
    if (!idx) return -1;
    const Shape& shape = model.tensors.at(*idx).shape;
    return axis < shape.size() ? shape[axis] : -1;
  }

  // `pieces` (in stored order) with every stack split, index-major at the
  // place of the stack's first key, recursively (layers, then experts):
  // the order of a TP=1/PP=1 model's sharded_state_dict.
  // `budget`: the pieces still allowed (see unstacked).
  void split_stacks(const CheckpointModel& model, const std::vector<Piece>& pieces, std::vector<Piece>& out,
                    uint64_t& budget) const {
    std::set<std::string> done;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      std::optional<Stack> stack = stack_of(pieces[i].name);
      if (!stack) {
        out.push_back(pieces[i]);
        continue;
      }
      if (!done.insert(stack->head).second) continue;
      const int64_t n = stack_count(model, pieces[i]);
      if (n > kMaxStackSlices)
        fail_data_loss(dir_ + ": '" + pieces[i].entry->key + "' is stacked " + std::to_string(n) + " deep under '" +
                       stack->head + "', more than the " + std::to_string(kMaxStackSlices) +
                       " layers or experts ckptconv splits a stack into");
      if (n > 0 && static_cast<uint64_t>(n) > budget)
        fail_data_loss(dir_ + ": '" + pieces[i].entry->key + "' is stacked " + std::to_string(n) + " deep under '" +
                       stack->head + "', more slices than the checkpoint stores data for");
      std::vector<std::vector<Piece>> slices(static_cast<std::size_t>(std::max<int64_t>(n, 0)));
      uint64_t made = 0;  // pieces put in `slices`, not yet in `out`
      for (std::size_t j = i; j < pieces.size(); ++j) {
        std::optional<Stack> other = stack_of(pieces[j].name);
        if (!other || other->head != stack->head) continue;
        int64_t m = stack_count(model, pieces[j]);
        if (m < 1 || m != n)
          fail_data_loss(dir_ + ": '" + pieces[j].entry->key + "' is stored under the stack '" + stack->head +
                         "' with " + (m < 1 ? std::string("no axis for it") : std::to_string(m) + " slices") + ", '" +
                         pieces[i].entry->key + "' with " + std::to_string(n) + "; not one stack");
        for (int64_t k = 0; k < n; ++k) {
          if (budget-- == 0)
            fail_data_loss(dir_ + ": the stacks under '" + stack->head +
                           "' split into more slices than the checkpoint stores data for");
          if (out.size() + ++made > kMaxPieces)
            fail_data_loss(dir_ + ": the stacks under '" + stack->head + "' split into more than " +
                           std::to_string(kMaxPieces) + " tensors, more than ckptconv builds from one checkpoint");
          Piece p = pieces[j];
          p.name = other->name(k);
          p.index.push_back(k);
          slices[static_cast<std::size_t>(k)].push_back(std::move(p));
        }
      }
      for (const auto& slice : slices) split_stacks(model, slice, out, budget);
    }
  }

  // The pieces of the entries `pick` selects (it gives each one's model
  // key: the stored key without optimizer.state.<kind>.), stacks split.
  template <typename Pick>
  std::vector<Piece> unstacked(const CheckpointModel& model, Pick pick) const {
    std::vector<Piece> pieces, out;
    // Every slice of a stack holds stored elements or a shard (a few are
    // empty): so many pieces at most, whatever shapes the metadata claims.
    uint64_t budget = 64 * entries_.size();
    for (const Entry& e : entries_) {
      std::string mkey;
      if (pick(e, mkey)) pieces.push_back({&e, mkey, {}});
      if (e.object) {
        budget += e.object->shards.size();
      } else if (auto idx = tensor_ref_index(*e.value)) {
        for (const TensorChunk& c : model.tensors.at(*idx).chunks) budget += c.numel();
      }
    }
    split_stacks(model, pieces, out, budget);
    return out;
  }

  // The value of `p`: its tensor narrowed to its slice (a new entry of
  // `model`), or its object's element.
  ValuePtr value_of(CheckpointModel& model, const Piece& p, const std::string& name) {
    if (p.entry->object) return object_value(*p.entry->object, p.index);
    auto idx = tensor_ref_index(*p.entry->value);
    if (!idx || p.index.empty()) return p.entry->value;
    TensorEntry t = model.tensors.at(*idx);
    for (int64_t k : p.index) t = layer_of(t, k, name);
    model.tensors.push_back(std::move(t));
    return make_tensor_ref(model.tensors.size() - 1);
  }

  ValuePtr model_view(CheckpointModel& model) {
    ValuePtr out = Value::dict();
    auto pick = [](const Entry& e, std::string& mkey) {
      mkey = e.key;
      return is_model_entry(e);
    };
    for (const Piece& p : unstacked(model, pick))
      out->entries.emplace_back(Value::str(p.name), value_of(model, p, p.name));
    return out;
  }

  ValuePtr optim_view(CheckpointModel& model, const ValuePtr& common) {
    bool fully = false, buckets = false;
    for (const Entry& e : entries_) {
      fully = fully || !optimizer_state_key(e.key).first.empty();
      buckets = buckets || unchained(e.key).rfind(kOptimizerBuckets, 0) == 0;
    }
    if (buckets && !fully)
      fail(ErrorCode::kUnimplemented,
           dir_ +
               ": the distributed optimizer was saved 'dp_reshardable': flat per-bucket buffers "
               "(optimizer.distributed.dp_group_idx_<i>.gbuf_idx_<g>.<dtype>.bucket_idx_<b>) and their "
               "per_bucket_numel; "
               "which parameter sits where in a bucket (the DistributedOptimizer's param_index_map, with its "
               "padding) is not stored, so --only optim cannot name their state. Consolidate without --only "
               "gives the buffers as stored; save with distrib_optim_sharding_type='fully_reshardable' for "
               "per-parameter state");
    if (!fully) fail(ErrorCode::kNotFound, dir_ + ": --only optim: the checkpoint holds no optimizer state");
    ValuePtr state = Value::dict();
    std::map<std::string, ValuePtr> by_name;
    auto pick = [](const Entry& e, std::string& mkey) {
      if (e.object) return false;
      mkey = optimizer_state_key(e.key).second;
      return !mkey.empty();
    };
    for (const Piece& p : unstacked(model, pick)) {
      std::string kind = optimizer_state_key(p.entry->key).first;
      ValuePtr& slot = by_name[p.name];
      if (!slot) {
        slot = Value::dict();
        state->entries.emplace_back(Value::str(p.name), slot);
      }
      slot->entries.emplace_back(Value::str(kind), value_of(model, p, p.name + "." + kind));
    }
    ValuePtr out = Value::dict();
    out->entries.emplace_back(Value::str("state"), state);
    // megatron-core keeps the optimizer's param_groups (no params lists:
    // the state is keyed by name) in the common state.
    ValuePtr groups = common ? param_groups(common) : nullptr;
    if (groups)
      out->entries.emplace_back(Value::str("param_groups"), groups);
    else
      log::warn(dir_ + ": common.pt holds no optimizer param_groups; --only optim gives the state alone");
    return out;
  }

  // The optimizer's param_groups in common.pt: {"optimizer": {"optimizer":
  // {"param_groups": [...]}, ...}}, or for a ChainedOptimizer
  // {"optimizer": {0: {...}, 1: {...}}}, whose groups are the chained
  // optimizers' in order (ChainedOptimizer.param_groups).
  static ValuePtr param_groups(const ValuePtr& common) {
    auto get = [](const ValuePtr& v, std::string_view key) -> ValuePtr {
      ValuePtr d = v ? mapping_of(v) : nullptr;
      return d && d->is(Kind::kDict) ? d->get(key) : nullptr;
    };
    auto groups_of = [&](const ValuePtr& opt) -> ValuePtr {
      ValuePtr g = get(get(opt, "optimizer"), "param_groups");
      return g && g->is(Kind::kList) ? g : nullptr;
    };
    ValuePtr opt = get(common, "optimizer");
    if (ValuePtr g = groups_of(opt)) return g;
    ValuePtr d = opt ? mapping_of(opt) : nullptr;
    if (!d || !d->is(Kind::kDict) || d->entries.empty()) return nullptr;
    std::vector<ValuePtr> all;
    for (const auto& [k, v] : d->entries) {
      ValuePtr g = k->is(Kind::kInt) ? groups_of(v) : nullptr;
      if (!g) return nullptr;
      all.insert(all.end(), g->items.begin(), g->items.end());
    }
    return Value::list(std::move(all));
  }

  std::string dir_;
  ProblemSink* sink_;
  std::string only_;
  std::vector<Entry> entries_;
  std::map<std::string, ObjectGroup> objects_;
};

}  // namespace

bool is_dist_checkpoint(const std::string& dir) {
  fs::path path = fs::path(dir) / kMetadataJson;
  EntryStat st = stat_path(path.string());
  if (!st.is_file() || st.size > kMaxMetadataJson) return false;
  // An empty one is megatron-core's, truncated (nothing else writes a
  // metadata.json beside DCP items): claimed, so the read refuses it by
  // name instead of reading the folder as plain DCP with another tree.
  if (st.size == 0) return true;
  // Claimed by the field's name alone, so that a damaged metadata.json is
  // refused as one rather than its directory read as plain DCP.
  try {
    SourcePtr src = open_mapped_source(path.string());
    return src->read_string(0, src->size()).find("\"sharded_backend\"") != std::string::npos;
  } catch (const Error& e) {
    // Linked out of the directory: claimed, so the read refuses it by name
    // instead of the directory being read as plain DCP without it.
    return e.code() == ErrorCode::kUnsafe;
  } catch (const std::exception&) {
    return false;
  }
}

CheckpointModel read_torch_dist(const std::string& dir, ProblemSink* problems, const std::string& only) {
  return TorchDistReader(dir, problems, only).read();
}

}  // namespace ckpt::megatron
