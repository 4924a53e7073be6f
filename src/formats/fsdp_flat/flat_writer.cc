#include "formats/fsdp_flat/flat_writer.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "core/error.h"
#include "formats/fsdp_flat/flat_params.h"
#include "formats/torch_pt/sharded_values.h"
#include "model/flat_range.h"
#include "model/tree_walk.h"

namespace ckpt::fsdp_flat {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// ---- 1-D views of tensors ---------------------------------------------------

// Elements [begin, begin + n) of the 1-D `flat`, as a 1-D tensor.
TensorEntry slice(const TensorEntry& flat, uint64_t begin, uint64_t n) {
  TensorEntry out;
  out.dtype = flat.dtype;
  out.shape = {int64_t(n)};
  for (const TensorChunk& c : flat.chunks) {
    const uint64_t o = uint64_t(c.offsets[0]), e = o + uint64_t(c.sizes[0]);
    const uint64_t lo = std::max(o, begin), hi = std::min(e, begin + n);
    if (lo >= hi) continue;
    TensorChunk s = c;
    s.offsets = {int64_t(lo - begin)};
    s.sizes = {int64_t(hi - lo)};
    s.storage_offset = c.storage_offset + int64_t(lo - o);
    out.chunks.push_back(std::move(s));
  }
  return out;
}

TensorEntry flat_of(const TensorEntry& t) {
  TensorEntry out;
  out.dtype = t.dtype;
  out.shape = {int64_t(t.numel())};
  append_flat(out, t, 0);
  return out;
}

// ---- the state dict ---------------------------------------------------------

struct Named {
  std::vector<std::string> order;
  std::map<std::string, ValuePtr> values;
};

Named entries_of(const ValuePtr& dict, const std::string& what) {
  Named out;
  ValuePtr d = dict ? mapping_of(dict) : nullptr;
  if (!d || !d->is(Kind::kDict)) fail_invalid(what + " is not a dict");
  for (const auto& [k, v] : d->entries) {
    const std::string name = path_component(*k);
    out.order.push_back(name);
    out.values[name] = v;
  }
  return out;
}

// A unit at the output world size: its parameters (in flat order), where
// each one starts, the flat parameter's numel and each rank's share.
struct OutUnit {
  const Fsdp1Unit* unit = nullptr;
  std::vector<const TensorEntry*> params;
  FlatOffsets at;
  uint64_t chunk = 0;
  DType dtype = DType::kFloat32;
  TensorEntry flat;  // the flat parameter, padding as zero chunks

  // Rank r's elements [begin, end) of the flat parameter.
  std::pair<uint64_t, uint64_t> rank_range(int r) const {
    uint64_t b = std::min<uint64_t>(at.total, chunk * uint64_t(r));
    return {b, std::min<uint64_t>(at.total, b + chunk)};
  }
};

// The members' tensors laid out as the flat parameter, `length` elements
// (zeros at the padding and past the members).
TensorEntry flat_of_members(const std::vector<const TensorEntry*>& members, const FlatOffsets& at, DType dtype,
                            uint64_t length) {
  TensorEntry v;
  v.dtype = dtype;
  v.shape = {int64_t(length)};
  uint64_t pos = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    append_zeros(v, pos, at.offsets[i] - pos);
    append_flat(v, *members[i], at.offsets[i]);
    pos = at.offsets[i] + members[i]->numel();
  }
  append_zeros(v, pos, length - pos);
  return v;
}

class Planner {
 public:
  Planner(const CheckpointModel& model, const Fsdp1Layout& layout, int world_size)
      : model_(model), layout_(layout), ws_(world_size) {}

  FlatPlan plan(const fsdp_ranks::RankFileName& model_name, const fsdp_ranks::RankFileName& optim_name) {
    const Value& root = *mapping_of(model_.root);
    ValuePtr m = root.is(Kind::kDict) ? root.get("model") : nullptr;
    ValuePtr o = root.is(Kind::kDict) ? root.get("optim") : nullptr;
    if (!m)
      fail_invalid(
          "FSDP1 flat-parameter files are written from the model's state dict (and the optimizer's): "
          "drop --only optim");
    model_entries_ = entries_of(m, "'model'");
    build_units();
    FlatPlan out;
    for (int r = 0; r < ws_; ++r) {
      out.files.push_back(model_file(r, file_name(model_name, r)));
      if (o) out.files.push_back(optim_file(r, file_name(optim_name, r), o));
    }
    for (const auto& f : out.files) out.tensor_bytes += f.tensor_bytes();
    return out;
  }

 private:
  // The family's name for rank r at this world size (veRL names say it).
  std::string file_name(fsdp_ranks::RankFileName name, int r) const {
    name.world_size = ws_;
    return name.name_for(r);
  }

  const TensorEntry& model_tensor(const std::string& name, const std::string& what) const {
    auto it = model_entries_.values.find(name);
    auto idx = it == model_entries_.values.end() ? std::nullopt : tensor_ref_index(*it->second);
    if (!idx) fail_invalid("the model state dict has no tensor '" + name + "' (" + what + ")");
    return model_.tensors.at(*idx);
  }

  void build_units() {
    for (const auto& u : layout_.units) {
      OutUnit ou;
      ou.unit = &u;
      std::vector<uint64_t> numels;
      for (const auto& p : u.params) {
        const TensorEntry& t = model_tensor(p, "a parameter of FSDP unit '" + u.key + "'");
        if (!ou.params.empty() && t.output_dtype() != ou.dtype)
          fail_invalid("FSDP unit '" + u.key + "' mixes dtypes ('" + p + "' is " +
                       std::string(dtype_name(t.output_dtype())) + "): a flat parameter has one");
        ou.dtype = t.output_dtype();
        ou.params.push_back(&t);
        numels.push_back(t.numel());
        unit_of_[p] = units_.size();
      }
      ou.at = flat_offsets(numels, u.alignment, ws_);
      ou.chunk = ceil_div(ou.at.total, uint64_t(ws_));
      ou.flat = flat_of_members(ou.params, ou.at, ou.dtype, ou.at.total);
      units_.push_back(std::move(ou));
    }
    for (const auto& [alias, target] : layout_.aliases) alias_of_[alias] = target;
  }

  static ValuePtr add(FlatFile& f, TensorEntry src) {
    f.tensors.push_back({src.output_dtype(), src.shape});
    f.sources.push_back(std::move(src));
    return make_tensor_ref(f.tensors.size() - 1);
  }

  // Rank r's view of parameter `name`: its elements in rank r's shard.
  TensorEntry view(const std::string& name, int r) const {
    const OutUnit& u = units_[unit_of_.at(name)];
    const std::size_t k =
        std::size_t(std::find(u.unit->params.begin(), u.unit->params.end(), name) - u.unit->params.begin());
    const uint64_t o = u.at.offsets[k], n = u.params[k]->numel();
    auto [b, e] = u.rank_range(r);
    const uint64_t lo = std::max(b, o), hi = std::max(lo, std::min(e, o + n));
    return slice(u.flat, lo, hi - lo);
  }

  FlatFile model_file(int r, const std::string& path) {
    FlatFile f{path, nullptr, {}, {}};
    std::vector<std::pair<ValuePtr, ValuePtr>> entries;
    for (const auto& name : model_entries_.order) {
      const bool param = unit_of_.count(name) > 0;
      auto alias = alias_of_.find(name);
      if (param || alias != alias_of_.end()) {
        // FSDP saves a view of every parameter name with use_orig_params=True, none without.
        if (layout_.use_orig_params)
          entries.emplace_back(Value::str(name), add(f, view(param ? name : alias->second, r)));
        continue;
      }
      const TensorEntry& t = model_tensor(name, "a buffer");
      entries.emplace_back(Value::str(name), add(f, t));
    }
    for (const OutUnit& u : units_) {
      auto [b, e] = u.rank_range(r);
      ValuePtr local = e > b ? add(f, slice(u.flat, b, e - b)) : Value::none();
      entries.emplace_back(Value::str(u.unit->key),
                           torch_pt::make_sharded_tensor(u.dtype, {int64_t(u.at.total)}, r, ws_, local));
    }
    f.root = Value::dict(std::move(entries), true);
    return f;
  }

  // An optimizer parameter: a unit's flat parameter (use_orig_params=False)
  // or one parameter (True). Its id is its place in the param groups.
  struct OptimParam {
    std::size_t unit = 0;
    std::string name;  // use_orig_params=True: the parameter
  };

  // param_groups with ids for names; `order` gets the optimizer's
  // parameters in id order (torch numbers them group by group).
  ValuePtr param_groups(const ValuePtr& groups, std::vector<OptimParam>& order) const {
    if (!groups || !groups->is(Kind::kList)) fail_invalid("'optim.param_groups' is not a list");
    std::vector<ValuePtr> out;
    for (std::size_t g = 0; g < groups->items.size(); ++g) {
      std::vector<std::pair<ValuePtr, ValuePtr>> entries;
      for (const auto& [k, v] : mapping_of(groups->items[g])->entries) {
        if (!(k->is(Kind::kStr) && k->text == "params")) {
          entries.emplace_back(k, v);
          continue;
        }
        std::vector<ValuePtr> ids;
        for (std::size_t i = 0; i < v->items.size();) {
          const std::string name = v->items[i]->is(Kind::kStr) ? v->items[i]->text : v->items[i]->repr(1);
          auto it = unit_of_.find(name);
          if (it == unit_of_.end())
            fail_invalid("param group " + std::to_string(g) + " lists '" + name +
                         "', which is no parameter of the FSDP1 model");
          ids.push_back(Value::integer(int64_t(order.size())));
          order.push_back({it->second, layout_.use_orig_params ? name : std::string()});
          if (layout_.use_orig_params) {
            ++i;
            continue;
          }
          // A flat parameter is one optimizer parameter: its names come together.
          for (const auto& member : units_[it->second].unit->params) {
            const bool next = i < v->items.size() && v->items[i]->is(Kind::kStr) && v->items[i]->text == member;
            if (!next)
              fail_invalid("param group " + std::to_string(g) + " does not list the parameters of FSDP unit '" +
                           units_[it->second].unit->key + "' together, in flat order ('" + member +
                           "'): with use_orig_params=False a unit is one optimizer parameter");
            ++i;
          }
        }
        entries.emplace_back(k, Value::list(std::move(ids)));
      }
      out.push_back(Value::dict(std::move(entries)));
    }
    return Value::list(std::move(out));
  }

  // One parameter's (or unit's) state on rank r: per-element tensors by
  // `per_element`, everything else as it is.
  template <typename PerElement>
  ValuePtr state_dict(FlatFile& f, const Value& first, const Shape& shape, PerElement per_element) {
    std::vector<std::pair<ValuePtr, ValuePtr>> entries;
    for (const auto& [k, v] : first.entries) {
      auto idx = tensor_ref_index(*v);
      if (!idx) {
        entries.emplace_back(k, v);
        continue;
      }
      const TensorEntry& t = model_.tensors.at(*idx);
      if (t.shape.empty()) {
        entries.emplace_back(k, add(f, t));
      } else if (t.shape == shape) {
        entries.emplace_back(k, add(f, per_element(path_component(*k))));
      } else {
        fail_invalid("optimizer state '" + t.name + "' has shape " + shape_str(t.shape) + ", its parameter " +
                     shape_str(shape) + ": FSDP1 keeps per-element state of the parameter's shape or scalars");
      }
    }
    return Value::dict(std::move(entries));
  }

  FlatFile optim_file(int r, const std::string& path, const ValuePtr& optim) {
    FlatFile f{path, nullptr, {}, {}};
    const Value& od = *mapping_of(optim);
    Named state = entries_of(od.get("state"), "'optim.state'");
    auto state_of = [&](const std::string& name) -> const Value* {
      auto it = state.values.find(name);
      return it == state.values.end() ? nullptr : mapping_of(it->second).get();
    };
    auto tensor_of = [&](const Value& st, const std::string& key, const std::string& name) -> const TensorEntry& {
      ValuePtr v = st.get(key);
      auto idx = v ? tensor_ref_index(*v) : std::nullopt;
      if (!idx) fail_invalid("optimizer state of '" + name + "' has no tensor '" + key + "'");
      return model_.tensors.at(*idx);
    };
    std::vector<OptimParam> order;
    ValuePtr groups = param_groups(od.get("param_groups"), order);
    std::vector<std::pair<ValuePtr, ValuePtr>> out_state;
    if (layout_.use_orig_params) {
      for (std::size_t id = 0; id < order.size(); ++id) {
        const std::string& name = order[id].name;
        const Value* st = state_of(name);
        const OutUnit& u = units_[unit_of_.at(name)];
        const std::size_t k =
            std::size_t(std::find(u.unit->params.begin(), u.unit->params.end(), name) - u.unit->params.begin());
        const uint64_t o = u.at.offsets[k], n = u.params[k]->numel();
        auto [b, e] = u.rank_range(r);
        const uint64_t lo = std::max(b, o), hi = std::min(e, o + n);
        if (!st || hi <= lo) continue;  // FSDP: no gradient where the rank holds none of it, so no state
        out_state.emplace_back(Value::integer(int64_t(id)),
                               state_dict(f, *st, u.params[k]->shape, [&](const std::string& key) {
                                 return slice(flat_of(tensor_of(*st, key, name)), lo - o, hi - lo);
                               }));
      }
    } else {
      for (std::size_t id = 0; id < order.size(); ++id) {
        const OutUnit& u = units_[order[id].unit];
        std::vector<const Value*> members;
        for (const auto& p : u.unit->params) members.push_back(state_of(p));
        const auto with = std::count_if(members.begin(), members.end(), [](const Value* v) { return v; });
        if (with == 0) continue;  // frozen, or never stepped
        if (std::size_t(with) != members.size())
          fail_invalid("FSDP unit '" + u.unit->key +
                       "': some of its parameters have optimizer state and some do not; with "
                       "use_orig_params=False the unit is one optimizer parameter");
        out_state.emplace_back(
            Value::integer(int64_t(id)), state_dict(f, *members[0], u.params[0]->shape, [&](const std::string& key) {
              std::vector<const TensorEntry*> parts;
              for (std::size_t m = 0; m < members.size(); ++m) {
                const TensorEntry& t = tensor_of(*members[m], key, u.unit->params[m]);
                if (t.shape != u.params[m]->shape)
                  fail_invalid("optimizer state '" + t.name + "' has shape " + shape_str(t.shape) + ", its parameter " +
                               shape_str(u.params[m]->shape));
                parts.push_back(&t);
              }
              // The padded shard: c elements on every rank, zeros past the data.
              TensorEntry padded = flat_of_members(parts, u.at, parts[0]->dtype, u.chunk * uint64_t(ws_));
              return slice(padded, u.chunk * uint64_t(r), u.chunk);
            }));
      }
    }
    f.root =
        Value::dict({{Value::str("state"), Value::dict(std::move(out_state))}, {Value::str("param_groups"), groups}});
    return f;
  }

  const CheckpointModel& model_;
  const Fsdp1Layout& layout_;
  const int ws_;
  Named model_entries_;
  std::vector<OutUnit> units_;
  std::map<std::string, std::size_t> unit_of_;
  std::map<std::string, std::string> alias_of_;
};

}  // namespace

FlatPlan plan_fsdp1_flat(const CheckpointModel& model, const Fsdp1Layout& layout, int world_size,
                         const fsdp_ranks::RankFileName& model_name, const fsdp_ranks::RankFileName& optim_name) {
  return Planner(model, layout, world_size).plan(model_name, optim_name);
}

}  // namespace ckpt::fsdp_flat
