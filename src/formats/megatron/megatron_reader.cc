#include "formats/megatron/megatron_reader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "formats/dcp/dcp_reader.h"
#include "formats/zero/zero_files.h"
#include "io/byte_source.h"
#include "model/tree_walk.h"

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
// The optimizer's entries (both distributed-optimizer layouts) start so.
constexpr std::string_view kOptimizerPrefix = "optimizer.";
constexpr std::string_view kOptimizerState = "optimizer.state.";          // fully_reshardable
constexpr std::string_view kOptimizerBuckets = "optimizer.distributed.";  // dp_reshardable

nlohmann::json read_metadata_json(const std::string& dir) {
  std::string path = (fs::path(dir) / kMetadataJson).string();
  SourcePtr src = open_mapped_source(path);
  if (src->size() > kMaxMetadataJson)
    fail_data_loss(path + ": " + std::to_string(src->size()) + " bytes, not megatron-core's metadata.json");
  try {
    nlohmann::json j = nlohmann::json::parse(src->read_string(0, src->size()));
    if (!j.is_object() || !j.contains("sharded_backend") || !j["sharded_backend"].is_string())
      fail_data_loss(path + ": no \"sharded_backend\" string (not megatron-core's metadata.json)");
    return j;
  } catch (const nlohmann::json::exception& e) {
    fail_data_loss(path + ": not JSON (" + e.what() + ")");
  }
}

// A sharded object's stored item: KEY/shard_<offsets>_<global shape>, each
// a dot-joined list of integers (mapping.py ShardedObject.unique_key).
struct ObjectShard {
  std::string key;
  Shape offsets;
  Shape shape;
};

std::optional<ObjectShard> parse_object_key(const std::string& item) {
  static const std::regex kShard(R"((.+)/shard_(\d+(?:\.\d+)*)_(\d+(?:\.\d+)*))");
  std::smatch m;
  if (!std::regex_match(item, m, kShard)) return std::nullopt;
  auto ints = [&](const std::string& text) {
    Shape out;
    std::size_t pos = 0;
    while (pos <= text.size()) {
      std::size_t dot = text.find('.', pos);
      std::string part = text.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
      if (part.size() > 12) fail_data_loss("sharded object '" + item + "': an offset or extent of " + part);
      out.push_back(std::stoll(part));
      if (dot == std::string::npos) break;
      pos = dot + 1;
    }
    return out;
  };
  ObjectShard s{m[1].str(), ints(m[2].str()), ints(m[3].str())};
  if (s.offsets.size() != s.shape.size())
    fail_data_loss("sharded object '" + item + "': " + std::to_string(s.offsets.size()) + " offsets for a " +
                   std::to_string(s.shape.size()) + "-d shape");
  for (std::size_t d = 0; d < s.shape.size(); ++d)
    if (s.offsets[d] >= s.shape[d])
      fail_data_loss("sharded object '" + item + "': offset " + std::to_string(s.offsets[d]) + " outside its shape " +
                     shape_str(s.shape));
  return s;
}

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

// The offsets of a row-major walk over `shape`.
std::vector<Shape> all_offsets(const Shape& shape) {
  std::vector<Shape> out;
  Shape idx(shape.size(), 0);
  uint64_t n = shape_numel(shape);
  for (uint64_t k = 0; k < n; ++k) {
    out.push_back(idx);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// The object's values as nested lists, by its shape (a missing shard,
// reported under validate, is None).
ValuePtr object_value(const ObjectGroup& g, std::size_t dim = 0, Shape prefix = {}) {
  std::vector<ValuePtr> items;
  for (int64_t i = 0; i < g.shape[dim]; ++i) {
    Shape at = prefix;
    at.push_back(i);
    if (dim + 1 == g.shape.size()) {
      auto it = g.shards.find(at);
      items.push_back(it == g.shards.end() ? Value::none() : it->second);
    } else {
      items.push_back(object_value(g, dim + 1, at));
    }
  }
  return Value::list(std::move(items));
}

// "decoder.layers." of "decoder.layers.self_attention.linear_qkv.weight":
// the key of a stacked layer parameter up to its `layers` component, when
// no layer index follows it (megatron-core stores the layers of a
// TransformerBlock stacked on a leading axis); empty otherwise.
std::string stacked_prefix(const std::string& key) {
  std::size_t pos = 0;
  while ((pos = key.find("layers.", pos)) != std::string::npos) {
    bool starts_component = pos == 0 || key[pos - 1] == '.';
    std::size_t next = pos + 7;
    if (starts_component && next < key.size() && !std::isdigit(static_cast<unsigned char>(key[next])))
      return key.substr(0, next);
    pos = next;
  }
  return "";
}

std::string layer_name(const std::string& key, const std::string& prefix, int64_t layer) {
  return prefix + std::to_string(layer) + "." + key.substr(prefix.size());
}

// Layer `layer` of a tensor stacked on its leading axis: the chunks that
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

class TorchDistReader {
 public:
  TorchDistReader(std::string dir, ProblemSink* sink, std::string only)
      : dir_(std::move(dir)), sink_(sink), only_(std::move(only)) {}

  CheckpointModel read() {
    nlohmann::json meta = read_metadata_json(dir_);
    const std::string backend = meta["sharded_backend"].get<std::string>();
    if (backend != "torch_dist")
      fail(ErrorCode::kUnimplemented, dir_ + "/" + kMetadataJson + ": sharded_backend '" + backend +
                                          "'; ckptconv reads megatron-core's 'torch_dist' checkpoints only");
    CheckpointModel model = dcp::read_dcp_dir(dir_, sink_);
    model.info.kind = SourceKind::kMegatron;
    for (const char* field : {"sharded_backend_version", "common_backend", "common_backend_version"})
      if (meta.contains(field)) model.facts[std::string("megatron ") + field] = meta[field].dump();
    model.info.files.push_back((fs::path(dir_) / kMetadataJson).string());
    split_items(model);
    check_objects();
    ValuePtr common = read_common(model);
    find_layers(model);
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
      std::optional<ObjectShard> shard = parse_object_key(key);
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
  }

  // Every shard of every object is stored (the DCP reader checks tensors).
  void check_objects() {
    for (const auto& [key, g] : objects_) {
      if (g.shards.size() == shape_numel(g.shape)) continue;
      std::string missing;
      int listed = 0;
      for (const Shape& at : all_offsets(g.shape)) {
        if (g.shards.count(at)) continue;
        if (listed++ < 5) missing += (missing.empty() ? "" : ", ") + shape_str(at);
      }
      report_or_fail(sink_,
                     Problem{ErrorCode::kDataLoss,
                             dir_ + ": sharded object '" + key + "' of shape " + shape_str(g.shape) + ": " +
                                 std::to_string(g.shards.size()) + " of its " + std::to_string(shape_numel(g.shape)) +
                                 " shards are stored and readable; missing: " + missing + (listed > 5 ? ", ..." : ""),
                             dir_ + "/.metadata", -1, key});
    }
  }

  // common.pt: what every rank held alike (iteration, the optimizer's
  // param_groups, a Megatron-LM job's args). A training script's own
  // objects in it are quarantined like DeepSpeed's client_state.
  ValuePtr read_common(CheckpointModel& model) {
    fs::path path = fs::path(dir_) / kCommonFile;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return nullptr;
    zero::Decoded d = zero::decode(path.string(), -1, sink_, only_);
    model.info.files.push_back(path.string());
    CheckpointModel part;
    part.root = d.root;
    part.tensors = std::move(d.tensors);
    return adopt(model, std::move(part));
  }

  // The number of layers under each stacked prefix: every stacked tensor
  // and object under it must agree.
  void find_layers(const CheckpointModel& model) {
    for (const Entry& e : entries_) {
      std::string key = e.key;
      if (key.rfind(kOptimizerState, 0) == 0) {
        std::size_t kind_end = key.find('.', kOptimizerState.size());
        if (kind_end == std::string::npos) continue;
        key = key.substr(kind_end + 1);
      } else if (key.rfind(kOptimizerPrefix, 0) == 0) {
        continue;
      }
      std::string prefix = stacked_prefix(key);
      if (prefix.empty()) continue;
      int64_t n = -1;
      if (e.object) {
        n = e.object->shape.empty() ? -1 : e.object->shape[0];
      } else if (auto idx = tensor_ref_index(*e.value)) {
        const TensorEntry& t = model.tensors.at(*idx);
        n = t.shape.empty() ? -1 : t.shape[0];
      } else {
        continue;
      }
      auto [it, fresh] = layers_.try_emplace(prefix, n);
      if (n < 0 || it->second != n)
        fail_data_loss(dir_ + ": '" + e.key + "' is stored under '" + prefix + "' with " +
                       (n < 0 ? std::string("no leading axis") : std::to_string(n) + " layers") +
                       ", other keys there with " + std::to_string(it->second) + "; not one stack of layers");
    }
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
    if (e.key.rfind(kOptimizerPrefix, 0) == 0) return false;
    // Objects: a module's _extra_state belongs to the model; others
    // (rng_state, a rerun state machine's) to the job.
    return !e.object || (e.key.size() >= 13 && e.key.compare(e.key.size() - 13, 13, "._extra_state") == 0);
  }

  // `e` (tensor or object) under `name`, or each of its layers.
  void add_unstacked(CheckpointModel& model, const Entry& e, int64_t layer, const std::string& name,
                     const ValuePtr& into) {
    if (e.object) {
      ValuePtr whole = object_value(*e.object);
      into->entries.emplace_back(Value::str(name), layer < 0 ? whole : whole->items.at(std::size_t(layer)));
      return;
    }
    auto idx = tensor_ref_index(*e.value);
    if (!idx || layer < 0) {
      into->entries.emplace_back(Value::str(name), e.value);
      return;
    }
    model.tensors.push_back(layer_of(model.tensors.at(*idx), layer, name));
    into->entries.emplace_back(Value::str(name), make_tensor_ref(model.tensors.size() - 1));
  }

  // Entries `pick` selects, layers unstacked layer-major at the place of
  // the first key of their stack; `pick` also gives the entry's model key
  // (the stored key without optimizer.state.<kind>.).
  template <typename Pick, typename Emit>
  void unstack(Pick pick, Emit emit) {
    std::set<std::string> done;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      std::string mkey;
      if (!pick(e, mkey)) continue;
      std::string prefix = stacked_prefix(mkey);
      if (prefix.empty() || !layers_.count(prefix)) {
        emit(e, mkey, -1, mkey);
        continue;
      }
      if (!done.insert(prefix).second) continue;
      for (int64_t layer = 0; layer < layers_.at(prefix); ++layer)
        for (std::size_t j = i; j < entries_.size(); ++j) {
          std::string mk;
          if (pick(entries_[j], mk) && stacked_prefix(mk) == prefix)
            emit(entries_[j], mk, layer, layer_name(mk, prefix, layer));
        }
    }
  }

  ValuePtr model_view(CheckpointModel& model) {
    ValuePtr out = Value::dict();
    unstack(
        [](const Entry& e, std::string& mkey) {
          mkey = e.key;
          return is_model_entry(e);
        },
        [&](const Entry& e, const std::string& mkey, int64_t layer, const std::string& name) {
          add_unstacked(model, e, layer, name, out);
        });
    return out;
  }

  ValuePtr optim_view(CheckpointModel& model, const ValuePtr& common) {
    bool fully = false, buckets = false;
    for (const Entry& e : entries_) {
      fully = fully || e.key.rfind(kOptimizerState, 0) == 0;
      buckets = buckets || e.key.rfind(kOptimizerBuckets, 0) == 0;
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
    unstack(
        [](const Entry& e, std::string& mkey) {
          if (e.object || e.key.rfind(kOptimizerState, 0) != 0) return false;
          std::size_t dot = e.key.find('.', kOptimizerState.size());
          if (dot == std::string::npos) return false;
          mkey = e.key.substr(dot + 1);
          return true;
        },
        [&](const Entry& e, const std::string& mkey, int64_t layer, const std::string& name) {
          std::string kind =
              e.key.substr(kOptimizerState.size(), e.key.size() - kOptimizerState.size() - mkey.size() - 1);
          ValuePtr& slot = by_name[name];
          if (!slot) {
            slot = Value::dict();
            state->entries.emplace_back(Value::str(name), slot);
          }
          add_unstacked(model, e, layer, kind, slot);
        });
    ValuePtr out = Value::dict();
    out->entries.emplace_back(Value::str("state"), state);
    // megatron-core keeps the optimizer's param_groups (no params lists:
    // the state is keyed by name) in the common state.
    ValuePtr groups;
    if (common) {
      ValuePtr c = mapping_of(common);
      ValuePtr opt = c->is(Kind::kDict) ? c->get("optimizer") : nullptr;
      ValuePtr inner = opt && mapping_of(opt)->is(Kind::kDict) ? mapping_of(opt)->get("optimizer") : nullptr;
      groups = inner && mapping_of(inner)->is(Kind::kDict) ? mapping_of(inner)->get("param_groups") : nullptr;
    }
    if (groups)
      out->entries.emplace_back(Value::str("param_groups"), groups);
    else
      log::warn(dir_ + ": common.pt holds no optimizer param_groups; --only optim gives the state alone");
    return out;
  }

  std::string dir_;
  ProblemSink* sink_;
  std::string only_;
  std::vector<Entry> entries_;
  std::map<std::string, ObjectGroup> objects_;
  std::map<std::string, int64_t> layers_;
};

}  // namespace

bool is_dist_checkpoint(const std::string& dir) {
  std::error_code ec;
  fs::path path = fs::path(dir) / kMetadataJson;
  if (!fs::is_regular_file(path, ec)) return false;
  uint64_t size = fs::file_size(path, ec);
  if (ec || size > kMaxMetadataJson) return false;
  // Claimed by the field's name alone, so that a damaged metadata.json is
  // refused as one rather than its directory read as plain DCP.
  try {
    SourcePtr src = open_mapped_source(path.string());
    return src->read_string(0, src->size()).find("\"sharded_backend\"") != std::string::npos;
  } catch (const std::exception&) {
    return false;
  }
}

CheckpointModel read_torch_dist(const std::string& dir, ProblemSink* problems, const std::string& only) {
  return TorchDistReader(dir, problems, only).read();
}

}  // namespace ckpt::megatron
