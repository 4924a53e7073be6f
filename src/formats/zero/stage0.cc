#include "formats/zero/stage0.h"

#include <algorithm>
#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/float_cast.h"
#include "core/log.h"
#include "core/paths.h"
#include "formats/zero/pipeline_layers.h"
#include "formats/zero/zero_files.h"
#include "model/tree_walk.h"

namespace ckpt::zero {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// One entry of the optimizer's param groups: group g's j-th `params` id.
struct Position {
  const Decoded* file = nullptr;  // the stage's model-states file holding it
  std::size_t group = 0;          // index in Stage0Reader::groups_ (every stage's, in stage order)
  int64_t id = 0;
  const Value* state = nullptr;   // its state dict; none for a parameter never stepped (a frozen one)
  const Value* master = nullptr;  // fp16: fp32_groups[g][j]; fp32: the module parameter is the master
};

// A parameter of the saved module (buffers and tied aliases left out).
struct ModuleParam {
  std::string name;
  const Decoded* file = nullptr;
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

// The `optimizer` entry of model-states file `f` of tag `dir`: DeepSpeed's
// _save_checkpoint writes the engine optimizer's state_dict() there without
// ZeRO, None where ZeRO keeps it in *_optim_states.pt files; None is
// NotFound, a ZeRO save whose optimizer files are missing.
ValuePtr optimizer_state(const Decoded& f, const std::string& dir) {
  ValuePtr opt = f.root->get("optimizer");
  if (is_none(opt)) {
    std::string mp = file_name(f.path);
    mp.resize(mp.size() - std::string_view("_model_states.pt").size());
    fail(ErrorCode::kNotFound, dir + ": no *_" + mp +
                                   "_optim_states.pt files (a ZeRO checkpoint has one per rank) "
                                   "and no optimizer state in " +
                                   file_name(f.path) + " (a run without ZeRO keeps it there)");
  }
  return opt;
}

// Stage 0 with tensor parallelism: the tensor-parallel ranks' files of a
// pipeline with a tensor axis (layer_LL-model_TT-model_states.pt) or of an
// mpu without layer files (mp_rank_01..); empty when the run has none.
std::string tensor_parallel_file(const TagListing& listing) {
  if (!listing.tp_layer_files.empty()) return listing.tp_layer_files.rbegin()->second.begin()->second;
  if (listing.mp_ranks.size() > 1 && listing.layer_files.empty()) return listing.mp_ranks[1].model[0].path;
  return "";
}

class Stage0Reader {
 public:
  // `stages`: each pipeline stage's mp_rank_SS_model_states.pt (one for a
  // data-parallel run); `layer_files`: a pipeline's, by layer index (none:
  // the module is the first file's `module`).
  Stage0Reader(std::string dir, const std::vector<std::string>& stages, const std::map<int, std::string>& layer_files,
               ProblemSink* problems, const std::string& only)
      : dir_(std::move(dir)) {
    for (std::size_t s = 0; s < stages.size(); ++s) stages_.push_back(decode(stages[s], int(s), problems, only));
    for (const auto& [layer, path] : layer_files) {
      layers_.push_back(decode(path, -1, problems, only, "entries of a layer state dict"));
      append_layer_entries(entries_, std::to_string(layer) + ".", layers_.back());
    }
  }

  CheckpointModel read() {
    for (const Decoded& f : stages_) read_optimizer(f);
    read_module();
    map_positions();
    CheckpointModel model;
    model.source = dir_;
    model.root = build(model);
    add_training_state(model, stages_.front());
    prune_unreferenced(model.root, model.tensors);
    describe(model);
    return model;
  }

 private:
  const std::string& path() const { return stages_.front().path; }

  // The optimizer's state dict: a torch optimizer's, or inside the fp16 wrapper's.
  void read_optimizer(const Decoded& f) {
    const std::string& path = f.path;
    const Value& o = as_dict(*optimizer_state(f, dir_));
    const std::string before = wrapper_;
    const Value* torch_sd = nullptr;
    const Value* masters_of_file = nullptr;
    if (o.get("fp32_groups_flat"))
      fail(ErrorCode::kUnimplemented, path +
                                          ": optimizer is DeepSpeed's fused FP16_Optimizer (fp32_groups_flat): "
                                          "not read (not generated as a fixture); FP16_UnfusedOptimizer and "
                                          "torch optimizers are");
    if (ValuePtr inner = o.get("optimizer_state_dict"); inner && o.get("fp32_groups")) {
      wrapper_ = "FP16_UnfusedOptimizer";
      torch_sd = &as_dict(*inner);
      masters_of_file = &*o.get("fp32_groups");
    } else if (o.get("state") && o.get("param_groups")) {
      torch_sd = &o;
      wrapper_.clear();
    } else {
      fail(ErrorCode::kUnimplemented, path +
                                          ": `optimizer` is neither a torch optimizer's state_dict (state, "
                                          "param_groups) nor FP16_UnfusedOptimizer's (optimizer_state_dict, "
                                          "fp32_groups)");
    }
    if (&f != &stages_.front() && wrapper_ != before)
      fail_data_loss(path + ": an optimizer of another kind than " + file_name(this->path()) + "'s");
    std::map<int64_t, const Value*> state;
    for (const auto& [k, v] : as_dict(*at(*torch_sd, "state", path)).entries)
      if (k->is(Kind::kInt)) state[k->int_value] = v.get();
    const auto& groups = at(*torch_sd, "param_groups", path)->as_sequence();
    if (masters_of_file && masters_of_file->as_sequence().size() != groups.size())
      fail_data_loss(path + ": fp32_groups has " + std::to_string(masters_of_file->as_sequence().size()) +
                     " groups, the optimizer " + std::to_string(groups.size()));
    std::set<int64_t> seen;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto& ids = at(*groups[g], "params", path)->as_sequence();
      const auto* masters = masters_of_file ? &masters_of_file->as_sequence()[g]->as_sequence() : nullptr;
      if (masters && masters->size() != ids.size())
        fail_data_loss(path + ": fp32_groups[" + std::to_string(g) + "] holds " + std::to_string(masters->size()) +
                       " masters for " + std::to_string(ids.size()) + " optimizer parameters");
      groups_.push_back({&f, g, groups[g].get()});
      for (std::size_t j = 0; j < ids.size(); ++j) {
        Position p{&f, groups_.size() - 1, ids[j]->as_int()};
        if (!seen.insert(p.id).second)
          fail_data_loss(path + ": optimizer parameter id " + std::to_string(p.id) + " is listed twice");
        if (auto it = state.find(p.id); it != state.end()) p.state = it->second;
        if (masters) p.master = (*masters)[j].get();
        positions_.push_back(p);
      }
    }
    for (const auto& [id, v] : state)
      if (!seen.count(id))
        fail_data_loss(path + ": optimizer state for id " + std::to_string(id) + ", which no param group lists");
    if (ValuePtr scale = o.get("cur_scale"); scale && (scale->is(Kind::kFloat) || scale->is(Kind::kInt)))
      loss_scale_ = scale->is(Kind::kFloat) ? scale->float_value : double(scale->int_value);
  }

  // module's parameters in order; buffers (buffer_names) and tied aliases (a
  // second name for an earlier entry's storage, as torch.save keeps it) aside.
  void read_module() {
    for (const Decoded& f : stages_)
      if (ValuePtr b = f.root->get("buffer_names"); b && b->is(Kind::kList))
        for (const auto& n : b->items) buffers_.insert(n->as_str());
    if (layers_.empty())
      for (const auto& [k, v] : as_dict(*at(*stages_.front().root, "module", path())).entries)
        entries_.push_back({k->as_str(), &stages_.front(), v.get()});
    std::map<std::tuple<std::string, std::string, int64_t, Shape, Shape>, std::string> owner_of;
    for (const ModuleEntry& e : entries_) {
      const std::string& name = e.name;
      const Value* v = e.value;
      module_.push_back({name, e.file, v, nullptr});
      if (buffers_.count(name) || !tensor_ref_index(*v)) continue;
      const TensorEntry& t = e.file->tensor(*v, e.file->path + ": '" + name + "'");
      if (t.chunks.size() == 1) {
        const TensorChunk& c = t.chunks[0];
        auto key = std::make_tuple(c.file, c.record, c.storage_offset, c.sizes, c.strides);
        if (auto it = owner_of.find(key); it != owner_of.end()) {
          alias_[name] = it->second;
          continue;
        }
        owner_of.emplace(key, name);
      }
      params_.push_back({name, e.file, v, &t});
    }
  }

  const TensorEntry& master_of(const Position& p) const {
    return p.file->tensor(*p.master, p.file->path + ": fp32_groups");
  }

  // The shape of what position p holds: its master's (fp16), else its
  // optimizer state's; nullopt when nothing it holds has the parameter's shape.
  std::optional<Shape> shape_of(const Position& p) const {
    if (p.master) return master_of(p).shape;
    if (!p.state) return std::nullopt;
    for (const auto& [k, v] : as_dict(*p.state).entries)
      if (tensor_ref_index(*v))
        if (const TensorEntry& t = p.file->tensor(*v, p.file->path); !t.shape.empty()) return t.shape;
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

  // A tied module (TiedLayerSpec) is held by every stage using it, each with
  // its own position; its layer parameter is the first stage's only, so a
  // later stage's position would be placed on another parameter. Without
  // ZeRO nothing names it, but DeepSpeed keeps the copies' optimizer state
  // equal: two stages' positions of one shape whose first exp_avg (first
  // state tensor) elements are equal are refused.
  void refuse_tied_positions() const {
    if (stages_.size() < 2) return;
    std::map<std::pair<Shape, std::string>, const Position*> seen;
    for (const Position& p : positions_) {
      if (!p.state) continue;
      const TensorEntry* first = nullptr;
      for (const auto& [k, v] : as_dict(*p.state).entries)
        if (tensor_ref_index(*v))
          if (const TensorEntry& t = p.file->tensor(*v, p.file->path); !t.shape.empty()) {
            first = &t;
            break;
          }
      if (!first) continue;
      std::optional<std::string> head =
          leading_elements(*first, std::min<std::size_t>(shape_numel(first->shape), 64), first->dtype);
      // all zero (a parameter no gradient reached) says nothing of a tie
      if (!head || head->find_first_not_of('\0') == std::string::npos) continue;
      auto [it, fresh] = seen.emplace(std::make_pair(first->shape, *head), &p);
      if (!fresh && it->second->file != p.file)
        fail(ErrorCode::kUnimplemented,
             p.file->path + ": optimizer position " + std::to_string(p.id) + " holds the same optimizer state as " +
                 file_name(it->second->file->path) + "'s position " + std::to_string(it->second->id) +
                 ": a module tied between pipeline stages (TiedLayerSpec), which the files of a run without ZeRO "
                 "do not name: not read");
    }
  }

  void map_positions() {
    refuse_tied_positions();
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
    const std::size_t groups = groups_.size();
    if (groups == stages_.size()) {  // one param group per stage: positions in module order
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
        // Said, not silent: nothing in the files ties a position to a name
        // here; a job whose optimizer got its parameters in another order
        // (same shapes) would get other names, as its own resume would.
        log::warn((stages_.size() > 1 ? dir_ : path()) + ": the optimizer's " + std::to_string(positions_.size()) +
                  " positions are matched to parameters in module order (the order model.parameters() gives; "
                  "a run without ZeRO records no names): right when the optimizer was built from "
                  "model.parameters(), as DeepSpeed builds it");
        return;
      }
      fail(ErrorCode::kUnimplemented,
           (stages_.size() > 1 ? dir_ : path()) + ": the optimizer holds " + std::to_string(positions_.size()) +
               " parameters, the module " + std::to_string(params_.size()) + "; " +
               (ways == 0 ? "no" : "more than one") +
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
        const Decoded& from = held && positions_[pos->second].master ? *positions_[pos->second].file : *e.file;
        std::size_t idx = copy_tensor(model, from, src, "model." + e.name);
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
        std::size_t idx = copy_tensor(model, *p.file, *v, name);
        const Shape& s = model.tensors[idx].shape;
        if (!s.empty() && s != param.tensor->shape)
          fail_data_loss(path() + ": optimizer state '" + key->as_str() + "' of '" + param.name + "' has shape " +
                         shape_str(s) + ", the parameter " + shape_str(param.tensor->shape));
        per_param->entries.emplace_back(key, make_tensor_ref(idx));
      }
      state->entries.emplace_back(Value::str(param.name), per_param);
    }
    // Param group g of every stage is one group (one ds_config): its
    // hyper-parameters agree, its params are every stage's in stage order.
    auto groups = Value::list({});
    std::vector<std::string> hypers;
    std::size_t k = 0;
    for (const GroupRef& ref : groups_) {
      auto hyper = Value::dict();
      for (const auto& [key, v] : ref.group->entries)
        if (!(key->is(Kind::kStr) && key->text == "params")) hyper->entries.emplace_back(key, v);
      const std::size_t n = at(*ref.group, "params", ref.file->path)->as_sequence().size();
      if (ref.index == groups->items.size()) {
        hyper->entries.emplace_back(Value::str("params"), Value::list({}));
        groups->items.push_back(hyper);
        hypers.push_back(hyper->repr(8, 64));
      } else if (ref.index > groups->items.size() || hypers[ref.index] != [&] {
                   auto h = std::make_shared<Value>(*hyper);
                   h->entries.emplace_back(Value::str("params"), Value::list({}));
                   return h->repr(8, 64);
                 }()) {
        fail(ErrorCode::kUnimplemented, ref.file->path + ": param group " + std::to_string(ref.index) +
                                            " has other hyper-parameters than " + file_name(path()) +
                                            "'s; ckptconv merges the stages' groups only where they agree");
      }
      ValuePtr names = groups->items[ref.index]->get("params");
      for (std::size_t j = 0; j < n; ++j) names->items.push_back(Value::str(params_[param_of_[k++]].name));
    }
    auto optim = Value::dict({{Value::str("state"), state}, {Value::str("param_groups"), groups}});
    return Value::dict({{Value::str("model"), model_dict}, {Value::str("optim"), optim}});
  }

  void describe(CheckpointModel& model) const {
    model.info.kind = SourceKind::kZero;
    for (const Decoded& f : stages_) model.info.files.push_back(f.path);
    for (const Decoded& f : layers_) model.info.files.push_back(f.path);
    std::sort(model.info.files.begin(), model.info.files.end());
    // FP16_UnfusedOptimizer holds exactly the trainable parameters
    // (is_optimized_parameter); a torch optimizer what the script gave it,
    // frozen ones too (z0_fp32_ws2): only the first says what was frozen.
    model.info.records_frozen = !wrapper_.empty();
    int dp = 1;
    if (ValuePtr v = stages_.front().root->get("dp_world_size"); v && v->is(Kind::kInt)) dp = int(v->int_value);
    const int pp = int(stages_.size());
    model.info.world_sizes = {dp * pp};
    model.info.parallel = ParallelDegrees{.data = dp, .pipeline = pp};
    model.facts["zero_stage"] = "0 (no ZeRO: optimizer state in " +
                                (pp > 1 ? "each stage's mp_rank_SS_model_states.pt" : file_name(path())) + ")";
    model.facts["optimizer"] =
        wrapper_.empty() ? "a torch optimizer's state_dict; fp32 masters are the module's weights"
                         : wrapper_ + " (fp32 masters in fp32_groups" +
                               (loss_scale_ ? ", loss scale " + format_number(*loss_scale_) : std::string()) + ")";
    model.facts["optimizer_positions"] = std::to_string(positions_.size()) + " mapped to module parameters by " + how_;
    if (ValuePtr v = stages_.front().root->get("ds_version"); v && v->is(Kind::kStr))
      model.facts["ds_version"] = v->text;
    model.facts["tag"] = file_name(dir_);
  }

  static std::string format_number(double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }

  // One param group of one stage's optimizer: its index there.
  struct GroupRef {
    const Decoded* file = nullptr;
    std::size_t index = 0;
    const Value* group = nullptr;
  };

  std::string dir_;
  std::deque<Decoded> stages_, layers_;  // deques: entries and positions point into them
  std::vector<ModuleEntry> entries_;     // the module state dict: `module`, or the layer files'
  std::vector<GroupRef> groups_;         // every stage's param groups, in stage order
  std::string wrapper_;                  // empty: a torch optimizer, no wrapper
  std::optional<double> loss_scale_;
  std::vector<Position> positions_;
  std::vector<ModuleParam> module_, params_;
  std::set<std::string> buffers_;
  std::map<std::string, std::string> alias_;  // alias -> owner
  std::vector<std::size_t> param_of_;         // position -> index in params_
  std::string how_;
};

}  // namespace

CheckpointModel read_stage0(const TagListing& listing, ProblemSink* problems, const std::string& only) {
  if (std::string tp_file = tensor_parallel_file(listing); !tp_file.empty()) {
    // The same names are a ZeRO save whose optimizer files are all missing:
    // mp_rank_00's `optimizer` tells, as it does for the runs read.
    optimizer_state(decode(listing.mp_ranks[0].model[0].path, 0, problems, only), listing.dir);
    fail(ErrorCode::kUnimplemented,
         tp_file +
             ": tensor parallelism at stage 0 (without ZeRO) is not supported (no such run was generated as a "
             "fixture); ckptconv reads stage-0 data-parallel and pipeline runs, and tensor parallelism under ZeRO");
  }
  std::vector<std::string> stages;  // list_files: at stage 0 each mp rank has its model-states file only
  for (const TagFiles& f : listing.mp_ranks) stages.push_back(f.model[0].path);
  return Stage0Reader(listing.dir, stages, listing.layer_files, problems, only).read();
}

std::optional<int> stage0_world_size(const std::string& dir) {
  try {
    const TagListing listing = list_files(dir);
    if (!listing.expert_files.empty() || listing.mp_ranks.empty()) return std::nullopt;
    for (const TagFiles& f : listing.mp_ranks)
      if (!f.optim.empty() || f.per_rank_model || f.model.size() != 1) return std::nullopt;
    const Decoded m0 = decode(listing.mp_ranks[0].model[0].path, 0, nullptr, "");
    optimizer_state(m0, dir);  // None: a ZeRO save missing its optimizer files (NotFound, caught below)
    int dp = 1;
    if (ValuePtr v = m0.root->get("dp_world_size");
        v && v->is(Kind::kInt) && v->int_value > 0 && v->int_value < (1 << 24))
      dp = int(v->int_value);
    return dp * int(listing.mp_ranks.size());
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace ckpt::zero
