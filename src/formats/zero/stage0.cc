#include "formats/zero/stage0.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/float_cast.h"
#include "core/paths.h"
#include "formats/zero/zero_files.h"
#include "model/tree_walk.h"

namespace ckpt::zero {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// One entry of the optimizer's param groups: group g's j-th `params` id.
struct Position {
  std::size_t group = 0;
  int64_t id = 0;
  const Value* state = nullptr;   // its state dict; none for a parameter never stepped (a frozen one)
  const Value* master = nullptr;  // fp16: fp32_groups[g][j]; fp32: the module parameter is the master
};

// A parameter of the saved module (buffers and tied aliases left out).
struct ModuleParam {
  std::string name;
  const Value* value = nullptr;
  const TensorEntry* tensor = nullptr;
};

bool is_none(const ValuePtr& v) { return !v || v->is(Kind::kNone); }

// Elements compared at most to tell same-shaped candidates apart: enough to
// tell two trained tensors apart, bounded so that a large model is not read here.
constexpr std::size_t kCompareElements = 1 << 16;

// The first n elements of a plain tensor as `to`; nullopt where the tensor
// is not one contiguous little-endian chunk or no native cast exists.
std::optional<std::string> leading_elements(const TensorEntry& t, std::size_t n, DType to) {
  if (t.chunks.size() != 1 || (t.dtype != to && !has_native_cast(t.dtype, to))) return std::nullopt;
  const TensorChunk& c = t.chunks[0];
  if (c.big_endian) return std::nullopt;
  int64_t expect = 1;
  for (std::size_t d = c.sizes.size(); d-- > 0;) {
    if (c.sizes[d] != 1 && c.strides.at(d) != expect) return std::nullopt;
    expect *= c.sizes[d];
  }
  const std::size_t in = dtype_size(t.dtype), out = dtype_size(to);
  std::string raw = c.storage->read_string(uint64_t(c.storage_offset) * in, n * in);
  if (t.dtype == to) return raw;
  std::string cast(n * out, '\0');
  if (!native_cast(reinterpret_cast<const std::byte*>(raw.data()), t.dtype, reinterpret_cast<std::byte*>(cast.data()),
                   to, n))
    return std::nullopt;
  return cast;
}

class Stage0Reader {
 public:
  Stage0Reader(const TagFiles& files, ProblemSink* problems, const std::string& only)
      : files_(files), m0_(decode(files.model.at(0).path, 0, problems, only)) {}

  CheckpointModel read() {
    read_optimizer();
    read_module();
    map_positions();
    CheckpointModel model;
    model.source = files_.dir;
    model.root = build(model);
    add_training_state(model, m0_);
    prune_unreferenced(model.root, model.tensors);
    describe(model);
    return model;
  }

 private:
  const std::string& path() const { return m0_.path; }

  // The optimizer's state dict: a torch optimizer's, or inside the fp16 wrapper's.
  void read_optimizer() {
    ValuePtr opt = m0_.root->get("optimizer");
    if (is_none(opt))
      fail(ErrorCode::kNotFound, files_.dir +
                                     ": no *_mp_rank_00_optim_states.pt files (a ZeRO checkpoint has one per rank) "
                                     "and no optimizer state in " +
                                     file_name(path()) + " (a run without ZeRO keeps it there)");
    const Value& o = as_dict(*opt);
    if (o.get("fp32_groups_flat"))
      fail(ErrorCode::kUnimplemented, path() +
                                          ": optimizer is DeepSpeed's fused FP16_Optimizer (fp32_groups_flat): "
                                          "not read (not generated as a fixture); FP16_UnfusedOptimizer and "
                                          "torch optimizers are");
    if (ValuePtr inner = o.get("optimizer_state_dict"); inner && o.get("fp32_groups")) {
      wrapper_ = "FP16_UnfusedOptimizer";
      torch_sd_ = &as_dict(*inner);
      masters_ = &*o.get("fp32_groups");
      if (ValuePtr scale = o.get("cur_scale"); scale && (scale->is(Kind::kFloat) || scale->is(Kind::kInt)))
        loss_scale_ = scale->is(Kind::kFloat) ? scale->float_value : double(scale->int_value);
    } else if (o.get("state") && o.get("param_groups")) {
      torch_sd_ = &o;
    } else {
      fail(ErrorCode::kUnimplemented, path() +
                                          ": `optimizer` is neither a torch optimizer's state_dict (state, "
                                          "param_groups) nor FP16_UnfusedOptimizer's (optimizer_state_dict, "
                                          "fp32_groups)");
    }
    std::map<int64_t, const Value*> state;
    for (const auto& [k, v] : as_dict(*at(*torch_sd_, "state", path())).entries)
      if (k->is(Kind::kInt)) state[k->int_value] = v.get();
    const auto& groups = at(*torch_sd_, "param_groups", path())->as_sequence();
    if (masters_ && masters_->as_sequence().size() != groups.size())
      fail_data_loss(path() + ": fp32_groups has " + std::to_string(masters_->as_sequence().size()) +
                     " groups, the optimizer " + std::to_string(groups.size()));
    std::set<int64_t> seen;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto& ids = at(*groups[g], "params", path())->as_sequence();
      const auto* masters = masters_ ? &masters_->as_sequence()[g]->as_sequence() : nullptr;
      if (masters && masters->size() != ids.size())
        fail_data_loss(path() + ": fp32_groups[" + std::to_string(g) + "] holds " + std::to_string(masters->size()) +
                       " masters for " + std::to_string(ids.size()) + " optimizer parameters");
      for (std::size_t j = 0; j < ids.size(); ++j) {
        Position p{g, ids[j]->as_int()};
        if (!seen.insert(p.id).second)
          fail_data_loss(path() + ": optimizer parameter id " + std::to_string(p.id) + " is listed twice");
        if (auto it = state.find(p.id); it != state.end()) p.state = it->second;
        if (masters) p.master = (*masters)[j].get();
        positions_.push_back(p);
      }
    }
    for (const auto& [id, v] : state)
      if (!seen.count(id))
        fail_data_loss(path() + ": optimizer state for id " + std::to_string(id) + ", which no param group lists");
  }

  // module's parameters in order; buffers (buffer_names) and tied aliases (a
  // second name for an earlier entry's storage, as torch.save keeps it) aside.
  void read_module() {
    if (ValuePtr b = m0_.root->get("buffer_names"); b && b->is(Kind::kList))
      for (const auto& n : b->items) buffers_.insert(n->as_str());
    std::map<std::tuple<std::string, std::string, int64_t, Shape, Shape>, std::string> owner_of;
    for (const auto& [k, v] : as_dict(*at(*m0_.root, "module", path())).entries) {
      std::string name = k->as_str();
      module_.push_back({name, v.get(), nullptr});
      if (buffers_.count(name) || !tensor_ref_index(*v)) continue;
      const TensorEntry& t = m0_.tensor(*v, path() + ": module '" + name + "'");
      if (t.chunks.size() == 1) {
        const TensorChunk& c = t.chunks[0];
        auto key = std::make_tuple(c.file, c.record, c.storage_offset, c.sizes, c.strides);
        if (auto it = owner_of.find(key); it != owner_of.end()) {
          alias_[name] = it->second;
          continue;
        }
        owner_of.emplace(key, name);
      }
      params_.push_back({name, v.get(), &t});
    }
  }

  const TensorEntry& master_of(const Position& p) const {
    return m0_.tensor(*p.master, path() + ": fp32_groups[" + std::to_string(p.group) + "]");
  }

  // The shape of what position p holds: its master's (fp16), else its
  // optimizer state's; nullopt when nothing it holds has the parameter's shape.
  std::optional<Shape> shape_of(const Position& p) const {
    if (p.master) return master_of(p).shape;
    if (!p.state) return std::nullopt;
    for (const auto& [k, v] : as_dict(*p.state).entries)
      if (tensor_ref_index(*v))
        if (const TensorEntry& t = m0_.tensor(*v, path()); !t.shape.empty()) return t.shape;
    return std::nullopt;
  }

  // The module parameters position p can be: its shape; for fp16, its master
  // cast to the module's dtype equal to the saved value.
  std::vector<std::size_t> candidates(const Position& p) const {
    std::optional<Shape> shape = shape_of(p);
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!shape || params_[i].tensor->shape == *shape) out.push_back(i);
    if (!p.master || out.size() < 2) return out;
    // A few elements first, more only among those still equal: a model's
    // many same-shaped layers are told apart without reading them whole.
    const DType lp = params_[out[0]].tensor->dtype;
    for (std::size_t limit : {std::size_t(64), kCompareElements}) {
      const std::size_t n = std::min<std::size_t>(shape_numel(*shape), limit);
      std::optional<std::string> want = leading_elements(master_of(p), n, lp);
      if (!want) return out;  // cannot compare: the shapes alone decide
      std::vector<std::size_t> equal;
      for (std::size_t i : out) {
        const TensorEntry& t = *params_[i].tensor;
        std::optional<std::string> got = t.dtype == lp ? leading_elements(t, n, lp) : std::nullopt;
        if (!got) return out;
        if (*got == *want) equal.push_back(i);
      }
      out = std::move(equal);
      if (out.size() < 2 || n == shape_numel(*shape)) break;
    }
    return out;
  }

  // Ways to place positions [from..] on parameters [at_param..] in order,
  // each on one of its candidates, counted up to 2 (1: the mapping; 2: ambiguous).
  int placements(const std::vector<std::vector<std::size_t>>& cand, std::size_t from, std::size_t at_param,
                 std::map<std::pair<std::size_t, std::size_t>, int>& memo) const {
    if (from == cand.size()) return 1;
    auto key = std::make_pair(from, at_param);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    int ways = 0;
    for (std::size_t i : cand[from])
      if (i >= at_param && ways < 2) ways = std::min(2, ways + placements(cand, from + 1, i + 1, memo));
    memo[key] = ways;
    return ways;
  }

  void map_positions() {
    std::vector<std::vector<std::size_t>> cand;
    for (const Position& p : positions_) cand.push_back(candidates(p));
    // Each position has one candidate, none shared: the files name them.
    std::set<std::size_t> taken;
    bool named = true;
    for (const auto& c : cand) named = named && c.size() == 1 && taken.insert(c[0]).second;
    if (named) {
      for (const auto& c : cand) param_of_.push_back(c[0]);
      how_ = wrapper_.empty() ? "shapes" : "masters equal to the module's fp16 values";
      return;
    }
    const std::size_t groups = at(*torch_sd_, "param_groups", path())->as_sequence().size();
    if (groups == 1) {
      std::map<std::pair<std::size_t, std::size_t>, int> memo;
      int ways = placements(cand, 0, 0, memo);
      if (ways == 1) {
        // the one placement: at each position, the one candidate the rest can follow
        std::size_t next = 0;
        for (std::size_t k = 0; k < cand.size(); ++k)
          for (std::size_t i : cand[k])
            if (i >= next && placements(cand, k + 1, i + 1, memo) > 0) {
              param_of_.push_back(i);
              next = i + 1;
              break;
            }
        how_ = "position order = module order, the one placement the shapes allow";
        return;
      }
      fail(ErrorCode::kUnimplemented,
           path() + ": the optimizer holds " + std::to_string(positions_.size()) + " parameters, the module " +
               std::to_string(params_.size()) + "; " + (ways == 0 ? "no" : "more than one") +
               " way to place them on the module's parameters in order matches their shapes" +
               (wrapper_.empty() ? "" : " and fp32 masters") +
               ": the files (param_shapes is None without ZeRO) do not say which parameter each is");
    }
    fail(ErrorCode::kUnimplemented, path() + ": " + std::to_string(groups) +
                                        " optimizer param groups whose parameters neither the shapes nor the fp32 "
                                        "masters tell apart: the files (param_shapes is None without ZeRO) do "
                                        "not say which parameter each position is");
  }

  ValuePtr build(CheckpointModel& model) {
    std::map<std::string, std::size_t> position_of;  // parameter name -> position
    for (std::size_t k = 0; k < positions_.size(); ++k) position_of[params_[param_of_[k]].name] = k;
    std::set<std::string> params;
    for (const ModuleParam& p : params_) params.insert(p.name);

    std::map<std::string, ValuePtr> refs;
    auto model_dict = Value::dict({}, true);
    for (const ModuleParam& e : module_) {
      ValuePtr ref;
      if (auto a = alias_.find(e.name); a != alias_.end()) {
        ref = refs.at(a->second);
      } else if (!tensor_ref_index(*e.value)) {
        ref = std::make_shared<Value>(*e.value);
      } else {
        auto pos = position_of.find(e.name);
        const bool held = pos != position_of.end();
        const Value& src = held && positions_[pos->second].master ? *positions_[pos->second].master : *e.value;
        std::size_t idx = copy_tensor(model, m0_, src, "model." + e.name);
        if (buffers_.count(e.name)) {
          model.tensors[idx].storage = StorageKind::kBuffer;
        } else if (!held) {
          model.tensors[idx].frozen = true;  // not in the optimizer: not trained
        } else if (model.tensors[idx].shape != params_[param_of_[pos->second]].tensor->shape) {
          fail_data_loss(path() + ": the fp32 master of '" + e.name + "' has shape " +
                         shape_str(model.tensors[idx].shape) + ", module " +
                         shape_str(params_[param_of_[pos->second]].tensor->shape));
        }
        ref = make_tensor_ref(idx);
      }
      refs[e.name] = ref;
      model_dict->entries.emplace_back(Value::str(e.name), ref);
    }

    auto state = Value::dict();
    for (std::size_t k = 0; k < positions_.size(); ++k) {
      const Position& p = positions_[k];
      if (!p.state) continue;
      const ModuleParam& param = params_[param_of_[k]];
      auto per_param = Value::dict();
      for (const auto& [key, v] : as_dict(*p.state).entries) {
        const std::string name = "optim.state." + param.name + "." + key->as_str();
        if (!tensor_ref_index(*v)) {
          per_param->entries.emplace_back(key, v);
          continue;
        }
        std::size_t idx = copy_tensor(model, m0_, *v, name);
        const Shape& s = model.tensors[idx].shape;
        if (!s.empty() && s != param.tensor->shape)
          fail_data_loss(path() + ": optimizer state '" + key->as_str() + "' of '" + param.name + "' has shape " +
                         shape_str(s) + ", the parameter " + shape_str(param.tensor->shape));
        per_param->entries.emplace_back(key, make_tensor_ref(idx));
      }
      state->entries.emplace_back(Value::str(param.name), per_param);
    }
    auto groups = Value::list({});
    std::size_t k = 0;
    for (const auto& g : at(*torch_sd_, "param_groups", path())->as_sequence()) {
      auto group = Value::dict();
      for (const auto& [key, v] : g->entries)
        if (!(key->is(Kind::kStr) && key->text == "params")) group->entries.emplace_back(key, v);
      auto names = Value::list({});
      for (std::size_t j = 0; j < at(*g, "params", path())->as_sequence().size(); ++j)
        names->items.push_back(Value::str(params_[param_of_[k++]].name));
      group->entries.emplace_back(Value::str("params"), names);
      groups->items.push_back(group);
    }
    auto optim = Value::dict({{Value::str("state"), state}, {Value::str("param_groups"), groups}});
    return Value::dict({{Value::str("model"), model_dict}, {Value::str("optim"), optim}});
  }

  void describe(CheckpointModel& model) const {
    model.info.kind = SourceKind::kZero;
    model.info.files.push_back(path());
    // FP16_UnfusedOptimizer holds exactly the trainable parameters
    // (is_optimized_parameter); a torch optimizer what the script gave it,
    // frozen ones too (z0_fp32_ws2): only the first says what was frozen.
    model.info.records_frozen = !wrapper_.empty();
    int dp = 1;
    if (ValuePtr v = m0_.root->get("dp_world_size"); v && v->is(Kind::kInt)) dp = int(v->int_value);
    model.info.world_sizes = {dp};
    model.info.parallel = ParallelDegrees{.data = dp};
    model.facts["zero_stage"] = "0 (no ZeRO: optimizer state in " + file_name(path()) + ")";
    model.facts["optimizer"] =
        wrapper_.empty() ? "a torch optimizer's state_dict; fp32 masters are the module's weights"
                         : wrapper_ + " (fp32 masters in fp32_groups" +
                               (loss_scale_ ? ", loss scale " + format_number(*loss_scale_) : std::string()) + ")";
    model.facts["optimizer_positions"] = std::to_string(positions_.size()) + " mapped to module parameters by " + how_;
    if (ValuePtr v = m0_.root->get("ds_version"); v && v->is(Kind::kStr)) model.facts["ds_version"] = v->text;
    model.facts["tag"] = file_name(files_.dir);
  }

  static std::string format_number(double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }

  const TagFiles& files_;
  Decoded m0_;
  std::string wrapper_;  // empty: a torch optimizer, no wrapper
  const Value* torch_sd_ = nullptr;
  const Value* masters_ = nullptr;
  std::optional<double> loss_scale_;
  std::vector<Position> positions_;
  std::vector<ModuleParam> module_, params_;
  std::set<std::string> buffers_;
  std::map<std::string, std::string> alias_;  // alias -> owner
  std::vector<std::size_t> param_of_;         // position -> index in params_
  std::string how_;
};

}  // namespace

CheckpointModel read_stage0(const TagFiles& files, ProblemSink* problems, const std::string& only) {
  return Stage0Reader(files, problems, only).read();
}

}  // namespace ckpt::zero
