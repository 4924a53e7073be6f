#include "formats/fsdp_flat/flat_params.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "model/flat_range.h"
#include "model/tensor_compare.h"
#include "model/tree_walk.h"

namespace ckpt::fsdp_flat {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr std::string_view kFlatParam = "_flat_param";
// use_orig_params=True aligns each parameter to 16 bytes of the forward
// dtype: 16 / itemsize elements (fp64 2, fp32 4, bf16/fp16 8, fp8 16); 0 is
// use_orig_params=False (no padding inside a flat parameter).
constexpr int kAlignments[] = {0, 4, 8, 2, 16};

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string list_names(const std::vector<std::string>& names, std::size_t most = 6) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < most; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > most) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

// ---- the layout checkpoint --------------------------------------------------

struct LayoutEntry {
  std::string name;
  Shape shape;
  int alias_of = -1;  // an earlier entry sharing its storage (a tied weight)
};

// The state dict of the layout checkpoint: its root, or its "model" entry
// when it holds {"model": ..., "optim": ...}.
std::vector<LayoutEntry> read_layout(const CheckpointModel& layout, const std::string& path) {
  ValuePtr root = mapping_of(layout.root);
  if (!root || !root->is(Kind::kDict))
    fail_invalid("--param-layout " + path + ": not a state dict (its root is not a dict)");
  if (ValuePtr model = root->get("model"); model && mapping_of(model) && mapping_of(model)->is(Kind::kDict))
    root = mapping_of(model);
  std::vector<LayoutEntry> out;
  // Tensors that share a storage record at one offset with one shape are
  // one parameter saved under two names.
  std::map<std::tuple<std::string, std::string, int64_t, Shape, Shape>, int> seen;
  walk_leaves(*root, [&](const Leaf& leaf) {
    if (!leaf.tensor) return;
    const TensorEntry& t = layout.tensors.at(*leaf.tensor);
    LayoutEntry e{leaf.path, t.shape};
    if (t.chunks.size() == 1 && !t.chunks[0].record.empty()) {
      const TensorChunk& c = t.chunks[0];
      auto [it, fresh] =
          seen.emplace(std::make_tuple(c.file, c.record, c.storage_offset, t.shape, c.strides), int(out.size()));
      if (!fresh) e.alias_of = it->second;
    }
    out.push_back(std::move(e));
  });
  if (out.empty()) fail_invalid("--param-layout " + path + ": holds no tensors");
  return out;
}

// ---- units ------------------------------------------------------------------

struct Unit {
  std::string key;     // "blocks.0._flat_param"
  std::string prefix;  // "blocks.0." ("" for the root unit)
  DType dtype = DType::kFloat32;
  uint64_t numel = 0;               // the ShardedTensor's global numel
  uint64_t chunk = 0;               // elements per rank: ceil(numel / world size)
  std::vector<TensorEntry> shards;  // per rank: its local shard as a 1-D tensor (shape {0} when it holds none)
  std::vector<int> params;          // layout entries, in flat order
  std::vector<uint64_t> offsets;    // each one's first element in the flat parameter
  int alignment = -1;               // the one that made the numel come out

  std::string label() const { return prefix.empty() ? "the root unit (_flat_param)" : "unit '" + key + "'"; }
  // Elements [begin, end) of the flat parameter that rank r holds.
  std::pair<uint64_t, uint64_t> rank_range(int r) const {
    uint64_t b = std::min<uint64_t>(numel, chunk * uint64_t(r));
    return {b, std::min<uint64_t>(numel, b + chunk)};
  }
};

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// The local shard of rank r's `_flat_param` ShardedTensor, checked against
// what FSDP gives that rank: [r*c, r*c + c) clipped to the numel.
TensorEntry local_shard(const Unit& u, const TensorEntry& st, const RankFile& f, int ws) {
  TensorEntry local;
  local.name = u.key;
  local.dtype = st.dtype;
  auto [b, e] = u.rank_range(f.rank);
  std::vector<const TensorChunk*> mine;
  for (const auto& c : st.chunks)
    if (c.numel() > 0) mine.push_back(&c);
  if (mine.size() > 1) fail_data_loss(f.path + ": '" + u.key + "' holds " + std::to_string(mine.size()) + " shards");
  uint64_t at = mine.empty() ? b : uint64_t(mine[0]->offsets.at(0));
  uint64_t len = mine.empty() ? 0 : mine[0]->numel();
  if (at != b || len != e - b)
    fail_data_loss(f.path + ": '" + u.key + "' of rank " + std::to_string(f.rank) + " holds elements [" +
                   std::to_string(at) + ", " + std::to_string(at + len) + ") of " + std::to_string(u.numel) +
                   ", but FSDP gives this rank [" + std::to_string(b) + ", " + std::to_string(e) + ") at world size " +
                   std::to_string(ws) + " (files of another world size?)");
  local.shape = {int64_t(len)};
  if (len) {
    TensorChunk c = *mine[0];
    c.offsets = {0};
    local.chunks.push_back(std::move(c));
  }
  return local;
}

// ---- the model files --------------------------------------------------------

struct ModelFiles {
  std::vector<Unit> units;                     // in rank 0's key order (the optimizer's id order when flat)
  std::map<std::string, TensorEntry> buffers;  // plain tensors kept whole on every rank, by name
  // use_orig_params=True: only then does FSDP save each parameter's view of the rank's shard
  bool orig_params = false;
};

ModelFiles read_model_files(const Inputs& in, const std::vector<LayoutEntry>& layout, const std::string& layout_path) {
  ModelFiles mf;
  std::map<std::string, const LayoutEntry*> by_name;
  for (const auto& e : layout) by_name.emplace(e.name, &e);
  // Per rank: its sharded and plain tensors by key.
  std::vector<std::map<std::string, const TensorEntry*>> plain(in.model.size());
  for (std::size_t i = 0; i < in.model.size(); ++i) {
    const RankFile& f = in.model[i];
    std::vector<std::string> unit_keys;
    walk_leaves(*f.model->root, [&](const Leaf& leaf) {
      if (!leaf.tensor) {
        if (leaf.value->is(Kind::kNone)) return;
        fail(ErrorCode::kUnimplemented, f.path + ": '" + leaf.path + "' is a " + leaf.value->repr(1) +
                                            ", not a tensor; a LOCAL_STATE_DICT of flat parameters holds tensors only");
      }
      const TensorEntry& t = f.model->tensors.at(*leaf.tensor);
      if (ends_with(leaf.path, kFlatParam) && t.is_sharded()) {
        if (t.shape.size() != 1) fail_data_loss(f.path + ": '" + leaf.path + "' is not 1-D");
        unit_keys.push_back(leaf.path);
        if (i == 0) {
          Unit u;
          u.key = leaf.path;
          u.prefix = leaf.path.substr(0, leaf.path.size() - kFlatParam.size());
          u.dtype = t.dtype;
          u.numel = uint64_t(t.shape[0]);
          u.chunk = ceil_div(u.numel, uint64_t(in.world_size));
          mf.units.push_back(std::move(u));
        }
        Unit* u = nullptr;
        for (auto& x : mf.units)
          if (x.key == leaf.path) u = &x;
        if (!u || u->numel != uint64_t(t.shape[0]) || u->dtype != t.dtype)
          fail_data_loss(f.path + ": '" + leaf.path + "' differs from " + in.model[0].path +
                         "'s (ranks of different models?)");
        u->shards.reserve(in.model.size());
        u->shards.push_back(local_shard(*u, t, f, in.world_size));
      } else {
        plain[i][leaf.path] = &t;
      }
    });
    if (unit_keys.size() != mf.units.size())
      fail_data_loss(f.path + ": holds " + std::to_string(unit_keys.size()) + " flat parameters, " + in.model[0].path +
                     " holds " + std::to_string(mf.units.size()));
  }
  // A plain tensor of the layout's shape on every rank is kept whole
  // (a buffer, or a parameter FSDP ignores); any other is a parameter's view.
  for (const auto& [name, t0] : plain[0]) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      fail_data_loss(in.model[0].path + ": holds '" + name + "', which the layout file " + layout_path +
                     " does not name (a layout of another model?)");
    bool whole = true;
    for (std::size_t i = 0; i < plain.size(); ++i) {
      auto p = plain[i].find(name);
      if (p == plain[i].end())
        fail_data_loss(in.model[i].path + ": lacks '" + name + "', which " + in.model[0].path + " holds");
      whole = whole && p->second->shape == it->second->shape;
    }
    if (!whole) {  // a parameter's view
      mf.orig_params = true;
      continue;
    }
    for (std::size_t i = 1; i < plain.size(); ++i)
      if (!same_tensor_bytes(*t0, *plain[i].at(name)))
        fail_data_loss("'" + name + "' is kept whole on every rank, but its bytes in " + in.model[0].path + " and " +
                       in.model[i].path + " differ");
    mf.buffers.emplace(name, *t0);
  }
  return mf;
}

// Each parameter of the layout to the innermost unit whose prefix it has,
// then each unit's offsets at the one alignment that gives its numel:
// none with use_orig_params=False, 16 bytes of the forward dtype with True
// (the files say which: only True keeps a view of each parameter).
void assign_params(ModelFiles& mf, const std::vector<LayoutEntry>& layout, int ws, const std::string& layout_path) {
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const LayoutEntry& e = layout[i];
    if (mf.buffers.count(e.name) || e.alias_of >= 0) continue;
    Unit* owner = nullptr;
    for (auto& u : mf.units)
      if (e.name.compare(0, u.prefix.size(), u.prefix) == 0 && (!owner || u.prefix.size() > owner->prefix.size()))
        owner = &u;
    if (!owner)
      fail_data_loss("parameter '" + e.name + "' of the layout file " + layout_path +
                     " is in no FSDP unit: no `_flat_param` key of the model files covers it (a layout of another "
                     "model, or model files of another wrap policy?)");
    owner->params.push_back(int(i));
  }
  const std::string mode = mf.orig_params ? "use_orig_params=True" : "use_orig_params=False";
  for (auto& u : mf.units) {
    std::vector<uint64_t> numels;
    std::vector<std::string> names;
    for (int p : u.params) {
      numels.push_back(shape_numel(layout[std::size_t(p)].shape));
      names.push_back(layout[std::size_t(p)].name + " " + shape_str(layout[std::size_t(p)].shape));
    }
    std::vector<std::pair<int, std::vector<uint64_t>>> fits;
    for (int a : kAlignments) {
      if ((a > 0) != mf.orig_params) continue;
      const FlatOffsets at = flat_offsets(numels, a, ws);
      bool same = std::any_of(fits.begin(), fits.end(), [&](const auto& f) { return f.second == at.offsets; });
      if (at.total == u.numel && !same) fits.emplace_back(a, at.offsets);
    }
    if (fits.size() == 1) {
      u.alignment = fits[0].first;
      u.offsets = fits[0].second;
      continue;
    }
    if (fits.empty()) {
      uint64_t expected = flat_offsets(numels, mf.orig_params ? 4 : 0, ws).total;
      fail_data_loss(u.label() + " holds " + std::to_string(u.numel) +
                     " elements, but the parameters the layout file " + layout_path + " gives it (" +
                     (names.empty() ? std::string("none") : list_names(names)) + ") add up to " +
                     std::to_string(expected) + " (" + mode + (mf.orig_params ? ", fp32 alignment" : "") +
                     ", world size " + std::to_string(ws) +
                     "). Likely cause: the layout is of another model, the job wrapped other modules (another wrap "
                     "policy), a tied weight the layout file does not save as shared storage, or another torch "
                     "version's flattening");
    }
    fail_data_loss(u.label() + ": its " + std::to_string(u.numel) +
                   " elements fit the layout file's parameters at more than one alignment (" +
                   std::to_string(fits[0].first) + " and " + std::to_string(fits[1].first) +
                   " elements); cannot tell where each parameter starts");
  }
}

// ---- the pieces of the result ----------------------------------------------

struct Builder {
  CheckpointModel out;
  std::string prefix;  // "model." / "optim." when both are given, else ""

  ValuePtr add(TensorEntry t, const std::string& name) {
    t.name = prefix + name;
    out.tensors.push_back(std::move(t));
    return make_tensor_ref(out.tensors.size() - 1);
  }
};

// A parameter-shaped tensor from 1-D per-rank slices: slice[r] holds the
// flat elements [starts[r], starts[r] + slice[r].numel) of the flat
// parameter; the parameter is the flat elements [offset, offset + numel).
TensorEntry gather(const std::vector<const TensorEntry*>& slices, const std::vector<uint64_t>& starts, uint64_t offset,
                   const Shape& shape, DType dtype, const std::string& what) {
  TensorEntry t;
  t.dtype = dtype;
  t.shape = shape;
  const uint64_t numel = shape_numel(shape), end = offset + numel;
  uint64_t covered = 0;
  for (std::size_t r = 0; r < slices.size(); ++r) {
    if (!slices[r]) continue;
    const uint64_t b = starts[r], e = b + uint64_t(slices[r]->shape.at(0));
    const uint64_t lo = std::max(b, offset), hi = std::min(e, end);
    if (lo >= hi) continue;
    add_flat_range(t, *slices[r], lo - b, lo - offset, hi - lo, int(r), what);
    covered += hi - lo;
  }
  if (covered != numel)
    fail_data_loss(what + ": the files hold " + std::to_string(covered) + " of its " + std::to_string(numel) +
                   " elements");
  return t;
}

ValuePtr build_model(Builder& b, const ModelFiles& mf, const std::vector<LayoutEntry>& layout) {
  std::map<int, std::pair<const Unit*, std::size_t>> where;
  for (const auto& u : mf.units)
    for (std::size_t k = 0; k < u.params.size(); ++k) where[u.params[k]] = {&u, k};
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const LayoutEntry& e = layout[i];
    int p = e.alias_of >= 0 ? e.alias_of : int(i);
    TensorEntry t;
    if (auto bf = mf.buffers.find(layout[std::size_t(p)].name); bf != mf.buffers.end()) {
      t = bf->second;
    } else {
      const auto [u, k] = where.at(p);
      std::vector<const TensorEntry*> slices;
      std::vector<uint64_t> starts;
      for (std::size_t r = 0; r < u->shards.size(); ++r) {
        slices.push_back(&u->shards[r]);
        starts.push_back(u->rank_range(int(r)).first);
      }
      t = gather(slices, starts, u->offsets[k], layout[std::size_t(p)].shape, u->dtype,
                 "'" + e.name + "' (in " + u->label() + ")");
    }
    entries.emplace_back(Value::str(e.name), b.add(std::move(t), e.name));
  }
  return Value::dict(std::move(entries));
}

// The optimizer's ids: one per unit (use_orig_params=False) or one per
// parameter (True), in the order the job's model.parameters() gave them.
struct IdTarget {
  const Unit* unit = nullptr;
  std::vector<std::size_t> members;  // indices into unit->params
};

// What one id's state says about which parameter it is: per rank, the
// length of its per-element tensors, kAbsent where the rank has no state for
// it, kScalarsOnly where it has state without per-element tensors.
constexpr int64_t kAbsent = -1, kScalarsOnly = -2;
using IdLengths = std::vector<int64_t>;

// Every optimizer parameter the model could have, in model.parameters()
// order: one per unit (use_orig_params=False), or one per parameter (True),
// with the per-element length each rank holds of it.
std::vector<IdTarget> all_targets(const ModelFiles& mf, const std::vector<LayoutEntry>& layout, int ws,
                                  std::vector<IdLengths>& expected) {
  std::vector<IdTarget> out;
  if (!mf.orig_params) {
    for (const auto& u : mf.units) {
      IdTarget t{&u, {}};
      for (std::size_t k = 0; k < u.params.size(); ++k) t.members.push_back(k);
      out.push_back(std::move(t));
      expected.emplace_back(std::size_t(ws), int64_t(u.chunk));  // the padded shard, on every rank
    }
    return out;
  }
  // model.parameters() order is registration order: the layout's.
  std::vector<std::tuple<int, const Unit*, std::size_t>> all;
  for (const auto& u : mf.units)
    for (std::size_t k = 0; k < u.params.size(); ++k) all.emplace_back(u.params[k], &u, k);
  std::sort(all.begin(), all.end());
  for (const auto& [p, u, k] : all) {
    out.push_back({u, {k}});
    IdLengths len;
    const uint64_t o = u->offsets[k], n = shape_numel(layout[std::size_t(p)].shape);
    for (int r = 0; r < ws; ++r) {
      auto [rb, re] = u->rank_range(r);
      const uint64_t lo = std::max(rb, o), hi = std::min(re, o + n);
      len.push_back(hi > lo ? int64_t(hi - lo) : 0);
    }
    expected.push_back(std::move(len));
  }
  return out;
}

// Could the id whose state has `got` be the parameter with `want`?
bool fits(const IdLengths& got, const IdLengths& want) {
  const bool per_element = std::any_of(got.begin(), got.end(), [](int64_t n) { return n >= 0; });
  for (std::size_t r = 0; r < got.size(); ++r) {
    if (got[r] >= 0 && got[r] != want[r]) return false;
    // A trained parameter has state on every rank that holds part of it.
    if (per_element && got[r] == kAbsent && want[r] > 0) return false;
  }
  return true;
}

// The leftmost and the rightmost order-keeping choice of targets for the
// ids got[b, e), among the targets not yet `taken`: greedy matching from
// either end finds one whenever any exists (each id's fit depends on its
// target alone), and every choice lies between the two id by id, so the
// choice is unique exactly when they agree. O(K + T) memory: a table of
// choices counted per (id, target) held K x T entries (7 GB at 40k).
struct Choices {
  bool found = true;
  std::vector<std::size_t> left, right;
};
Choices choices(const std::vector<IdLengths>& got, std::size_t b, std::size_t e, const std::vector<IdLengths>& want,
                const std::vector<bool>& taken) {
  const std::size_t T = want.size();
  auto free_fit = [&](std::size_t k, std::size_t t) { return !taken[t] && fits(got[k], want[t]); };
  Choices c;
  c.left.resize(e - b);
  c.right.resize(e - b);
  for (std::size_t k = b, t = 0; k < e && c.found; ++k, ++t) {
    while (t < T && !free_fit(k, t)) ++t;
    if (t == T)
      c.found = false;
    else
      c.left[k - b] = t;
  }
  for (std::size_t k = e, t = T; k-- > b && c.found;) {
    while (t > 0 && !free_fit(k, t - 1)) --t;
    if (t == 0)
      c.found = false;
    else
      c.right[k - b] = --t;
  }
  return c;
}

// Which optimizer parameter each id is. The ids come in param groups
// (`group_sizes`, in order), each built from parameters in model order:
// all of the model's, or a subset (the trainable ones; weights with weight
// decay in one group, biases and norms in another). Each group's ids are
// matched to the one order-keeping choice of parameters that fits every
// rank's state lengths, among those no other group's certain choice holds;
// groups are settled in turn until none is left, else DataLoss naming the
// group whose ids more than one choice (or none) fits.
std::vector<IdTarget> id_targets(const ModelFiles& mf, const std::vector<LayoutEntry>& layout, int ws,
                                 const std::vector<IdLengths>& got, const std::vector<std::size_t>& group_sizes,
                                 const std::string& file) {
  std::vector<IdLengths> want;
  std::vector<IdTarget> all = all_targets(mf, layout, ws, want);
  const std::string kind = mf.orig_params ? " parameters (use_orig_params=True)" : " flat parameters";
  const std::size_t K = got.size(), T = all.size();
  if (K > T)
    fail_data_loss(file + ": its param_groups list " + std::to_string(K) + " parameter ids, but the model has " +
                   std::to_string(T) + kind + " (a layout of another model?)");
  const std::size_t G = group_sizes.size();
  std::vector<std::size_t> begin(G + 1, 0);
  for (std::size_t g = 0; g < G; ++g) begin[g + 1] = begin[g] + group_sizes[g];
  std::vector<bool> taken(T, false), settled(G, false);
  std::vector<std::size_t> target(K);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t g = 0; g < G; ++g) {
      if (settled[g]) continue;
      Choices c = choices(got, begin[g], begin[g + 1], want, taken);
      const std::string which = G == 1 ? std::string() : " (param group " + std::to_string(g) + ")";
      if (!c.found)
        fail_data_loss(file + ": its param_groups list " + std::to_string(K) + " parameter ids" + which +
                       ", the model has " + std::to_string(T) + kind +
                       ", and no choice of them in model order fits every rank's state lengths: each param group "
                       "must be built from parameters in model order (model.parameters() or a subset of it)");
      if (c.left != c.right) continue;
      for (std::size_t i = 0; i < c.left.size(); ++i) {
        target[begin[g] + i] = c.left[i];
        taken[c.left[i]] = true;
      }
      settled[g] = progress = true;
    }
  }
  for (std::size_t g = 0; g < G; ++g) {
    if (settled[g]) continue;
    Choices c = choices(got, begin[g], begin[g + 1], want, taken);
    std::string example;
    for (std::size_t i = 0; i < c.left.size() && example.empty(); ++i)
      if (c.left[i] != c.right[i]) {
        auto name = [&](std::size_t t) {
          return mf.orig_params ? layout[std::size_t(all[t].unit->params[all[t].members[0]])].name
                                : all[t].unit->label();
        };
        example =
            "; its id " + std::to_string(begin[g] + i) + " could be " + name(c.left[i]) + " or " + name(c.right[i]);
      }
    fail_data_loss(file + ": its param_groups list " + std::to_string(K) + " parameter ids" +
                   (G == 1 ? std::string() : " (param group " + std::to_string(g) + ")") + ", the model has " +
                   std::to_string(T) + kind + ", and more than one choice of them fits every rank's state lengths" +
                   example +
                   ": the optimizer must be built from model.parameters(), or from subsets of it in that order "
                   "that the state tells apart");
  }
  std::vector<IdTarget> out;
  out.reserve(K);
  for (std::size_t t : target) out.push_back(all[t]);
  return out;
}

const Value& dict_of(const ValuePtr& v, const std::string& what) {
  ValuePtr d = v ? mapping_of(v) : nullptr;
  if (!d || !d->is(Kind::kDict)) fail_data_loss(what + " is not a dict");
  return *d;
}

// A state dict's entries by parameter id, the first of a repeated id
// winning: looked up once per id, so never by a scan (quadratic at 10^4 ids).
class IdIndex {
 public:
  explicit IdIndex(const Value& dict) {
    by_id_.reserve(dict.entries.size());
    for (const auto& [k, v] : dict.entries)
      if (k->is(Kind::kInt)) by_id_.emplace(k->int_value, v);
  }
  ValuePtr find(int64_t id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
  }

 private:
  std::unordered_map<int64_t, ValuePtr> by_id_;
};

// FSDP.optim_state_dict's form: state keyed by parameter name (every name
// of a unit shares its flat parameter's scalars, such as `step`),
// param_groups listing names.
ValuePtr build_optim(Builder& b, const ModelFiles& mf, const std::vector<LayoutEntry>& layout, const Inputs& in) {
  const RankFile& f0 = in.optim.at(0);
  const Value& root0 = dict_of(f0.model->root, f0.path);
  ValuePtr groups = root0.get("param_groups");
  if (!groups || !groups->is(Kind::kList)) fail_data_loss(f0.path + ": no param_groups list");
  std::vector<int64_t> ids;
  std::vector<std::size_t> group_sizes;
  for (const auto& g : groups->items) {
    ValuePtr params = dict_of(g, f0.path + ": a param group").get("params");
    if (!params || !params->is(Kind::kList)) fail_data_loss(f0.path + ": a param group without a params list");
    group_sizes.push_back(params->items.size());
    for (const auto& p : params->items) {
      if (!p->is(Kind::kInt)) fail_data_loss(f0.path + ": param_groups params " + p->repr(1) + " is not an id");
      ids.push_back(p->int_value);
    }
  }
  std::vector<IdIndex> states;
  for (const auto& f : in.optim) {
    ValuePtr st = dict_of(f.model->root, f.path).get("state");
    states.emplace_back(dict_of(st, f.path + ": 'state'"));
  }
  std::vector<IdLengths> lengths;
  for (int64_t id : ids) {
    IdLengths len;
    for (std::size_t r = 0; r < states.size(); ++r) {
      ValuePtr st = states[r].find(id);
      int64_t n = st ? kScalarsOnly : kAbsent;
      if (st && mapping_of(st))
        for (const auto& [key, v] : mapping_of(st)->entries)
          if (auto idx = tensor_ref_index(*v); idx && in.optim[r].model->tensors.at(*idx).shape.size() == 1) {
            n = in.optim[r].model->tensors.at(*idx).shape[0];
            break;
          }
      len.push_back(n);
    }
    lengths.push_back(std::move(len));
  }
  std::vector<IdTarget> targets = id_targets(mf, layout, in.world_size, lengths, group_sizes, f0.path);
  // The name of the id's m-th parameter.
  auto name_of = [&](const IdTarget& t, std::size_t m) {
    return layout[std::size_t(t.unit->params[t.members[m]])].name;
  };

  std::vector<std::pair<ValuePtr, ValuePtr>> state_out;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const IdTarget& t = targets[k];
    const Unit& u = *t.unit;
    std::vector<ValuePtr> per_rank(in.optim.size());
    int first = -1;
    for (std::size_t r = 0; r < in.optim.size(); ++r) {
      per_rank[r] = states[r].find(ids[k]);
      if (per_rank[r] && first < 0) first = int(r);
    }
    if (first < 0) continue;  // frozen, or never stepped: no state, as FSDP gives it
    const std::string id_what = "state " + std::to_string(ids[k]) + " (" + name_of(t, 0) +
                                (t.members.size() > 1 ? " and the rest of " + u.label() : "") + ")";
    const Value& first_dict = dict_of(per_rank[std::size_t(first)], in.optim[std::size_t(first)].path + ": " + id_what);
    // Rank r's slice of this id: the flat elements [start, start + len).
    auto slice_of = [&](int r) -> std::pair<uint64_t, uint64_t> {
      auto [rb, re] = u.rank_range(r);
      if (!mf.orig_params) return {uint64_t(r) * u.chunk, u.chunk};  // padded to c on every rank
      uint64_t o = u.offsets[t.members[0]], n = shape_numel(layout[std::size_t(u.params[t.members[0]])].shape);
      uint64_t lo = std::max(rb, o), hi = std::min(re, o + n);
      return {lo, hi > lo ? hi - lo : 0};
    };
    std::vector<std::vector<std::pair<ValuePtr, ValuePtr>>> per_name(t.members.size());
    for (const auto& [key, v0] : first_dict.entries) {
      const std::string key_name = key->is(Kind::kStr) ? key->text : key->repr(1);
      auto idx0 = tensor_ref_index(*v0);
      const CheckpointModel& m0 = *in.optim[std::size_t(first)].model;
      if (!idx0 || m0.tensors.at(*idx0).shape.empty()) {  // a scalar, the same for every name
        for (std::size_t m = 0; m < t.members.size(); ++m) {
          ValuePtr v = idx0 ? b.add(m0.tensors.at(*idx0), "state." + name_of(t, m) + "." + key_name)
                            : std::make_shared<Value>(*v0);
          per_name[m].emplace_back(key, v);
        }
        continue;
      }
      std::vector<const TensorEntry*> slices(in.optim.size(), nullptr);
      std::vector<uint64_t> starts(in.optim.size(), 0);
      for (std::size_t r = 0; r < in.optim.size(); ++r) {
        const RankFile& f = in.optim[r];
        auto [start, len] = slice_of(int(r));
        const std::string what = f.path + ": '" + id_what + "." + key_name + "' (rank " + std::to_string(r) + ")";
        if (!per_rank[r]) {
          if (len)
            fail_data_loss(f.path + ": lacks " + id_what + ", which rank " + std::to_string(first) +
                           " holds and of which this rank holds " + std::to_string(len) + " elements");
          continue;
        }
        ValuePtr v = dict_of(per_rank[r], what).get(key_name);
        auto idx = v ? tensor_ref_index(*v) : std::nullopt;
        if (!idx) fail_data_loss(what + ": missing or not a tensor");
        const TensorEntry& te = f.model->tensors.at(*idx);
        if (te.shape.size() != 1 || uint64_t(te.shape[0]) != len)
          fail_data_loss(what + " has shape " + shape_str(te.shape) + ", but the layout gives this rank " +
                         std::to_string(len) + " elements of " + u.label() +
                         " (a layout of another model, or files of another world size?)");
        slices[r] = &te;
        starts[r] = start;
      }
      const TensorEntry& proto = m0.tensors.at(*idx0);
      for (std::size_t m = 0; m < t.members.size(); ++m) {
        const LayoutEntry& e = layout[std::size_t(u.params[t.members[m]])];
        TensorEntry g = gather(slices, starts, u.offsets[t.members[m]], e.shape, proto.dtype,
                               "optimizer state '" + e.name + "." + key_name + "'");
        per_name[m].emplace_back(key, b.add(std::move(g), "state." + e.name + "." + key_name));
      }
    }
    for (std::size_t m = 0; m < t.members.size(); ++m)
      state_out.emplace_back(Value::str(name_of(t, m)), Value::dict(std::move(per_name[m])));
  }

  std::vector<ValuePtr> groups_out;
  std::size_t next = 0;
  for (const auto& g : groups->items) {
    std::vector<std::pair<ValuePtr, ValuePtr>> entries;
    for (const auto& [key, v] : dict_of(g, f0.path).entries) {
      if (!(key->is(Kind::kStr) && key->text == "params")) {
        entries.emplace_back(key, v);
        continue;
      }
      std::vector<ValuePtr> names;
      for (std::size_t i = 0; i < v->items.size(); ++i, ++next)
        for (std::size_t m = 0; m < targets[next].members.size(); ++m)
          names.push_back(Value::str(name_of(targets[next], m)));
      entries.emplace_back(key, Value::list(std::move(names)));
    }
    groups_out.push_back(Value::dict(std::move(entries)));
  }
  return Value::dict({{Value::str("state"), Value::dict(std::move(state_out))},
                      {Value::str("param_groups"), Value::list(std::move(groups_out))}});
}

}  // namespace

FlatOffsets flat_offsets(const std::vector<uint64_t>& numels, int alignment, int world_size) {
  FlatOffsets out;
  const uint64_t a = uint64_t(alignment), ws = uint64_t(world_size);
  for (uint64_t n : numels) {
    if (a > 0 && out.total % a) out.total += a - out.total % a;
    out.offsets.push_back(out.total);
    out.total += n;
  }
  if (a > 0 && out.total % ws) out.total += ws - out.total % ws;
  return out;
}

bool holds_flat_params(const CheckpointModel& model) {
  bool found = false;
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    found = found || (leaf.tensor && ends_with(leaf.path, kFlatParam) && model.tensors.at(*leaf.tensor).is_sharded());
  });
  return found;
}

bool holds_flat_optimizer_state(const CheckpointModel& model) {
  const Value& root = *model.root;
  ValuePtr state = root.is(Kind::kDict) ? root.get("state") : nullptr;
  if (!state || !state->is(Kind::kDict) || state->entries.empty()) return false;
  for (const auto& [key, per_param] : state->entries) {
    if (!key->is(Kind::kInt)) return false;
    if (!per_param->is(Kind::kDict)) continue;
    for (const auto& [name, value] : per_param->entries) {
      auto idx = tensor_ref_index(*value);
      if (!idx) continue;
      const TensorEntry& t = model.tensors.at(*idx);
      if (!t.is_sharded() && t.shape.size() == 1) return true;
    }
  }
  return false;
}

}  // namespace ckpt::fsdp_flat

namespace ckpt::fsdp_flat {

CheckpointModel unflatten(const Inputs& in, const CheckpointModel& layout_model, const std::string& layout_path) {
  if (in.model.empty())
    fail_invalid(
        "the optimizer files are a raw optim.state_dict() of FSDP1 flat parameters: unflattening them needs "
        "the job's LOCAL_STATE_DICT model files beside them (their `_flat_param` keys give the FSDP units)");
  const std::vector<LayoutEntry> layout = read_layout(layout_model, layout_path);
  ModelFiles mf = read_model_files(in, layout, layout_path);
  assign_params(mf, layout, in.world_size, layout_path);
  const bool optim = in.want_optim && !in.optim.empty();
  const bool both = in.want_model && optim;
  Builder b;
  ValuePtr model_root, optim_root;
  if (in.want_model) {
    b.prefix = both ? "model." : "";
    model_root = build_model(b, mf, layout);
  }
  if (optim) {
    b.prefix = both ? "optim." : "";
    optim_root = build_optim(b, mf, layout, in);
  }
  if (!model_root && !optim_root) fail_invalid("--only optim: no raw optimizer files beside the model files");
  b.out.root = both ? Value::dict({{Value::str("model"), model_root}, {Value::str("optim"), optim_root}})
                    : (model_root ? model_root : optim_root);
  Fsdp1Layout fl;
  fl.use_orig_params = mf.orig_params;
  std::vector<int> order;
  for (const auto& u : mf.units) {
    Fsdp1Unit fu{u.key, {}, u.alignment};
    for (int p : u.params) {
      fu.params.push_back(layout[std::size_t(p)].name);
      order.push_back(p);
    }
    fl.units.push_back(std::move(fu));
  }
  for (const auto& e : layout)
    if (e.alias_of >= 0 && !mf.buffers.count(layout[std::size_t(e.alias_of)].name))
      fl.aliases.emplace_back(e.name, layout[std::size_t(e.alias_of)].name);
  const std::size_t params = order.size();
  b.out.info.fsdp1 = std::move(fl);
  b.out.facts["fsdp1_flat_params"] = std::to_string(mf.units.size()) + " units, " + std::to_string(params) +
                                     " parameters, use_orig_params=" + (mf.orig_params ? "True" : "False") +
                                     ", layout from " + layout_path;
  return std::move(b.out);
}

}  // namespace ckpt::fsdp_flat
