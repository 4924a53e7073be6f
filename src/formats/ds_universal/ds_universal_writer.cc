#include "formats/ds_universal/ds_universal_writer.h"

#include <bit>
#include <cstdint>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "formats/zero/moe_experts.h"
#include "model/tree_walk.h"

namespace ckpt::ds_universal {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// The DeepSpeed version whose layout these files follow, for a source that
// names none (the engine refuses an empty ds_version and parses it).
constexpr const char* kDsVersion = "0.19.8";

// Top-level entries of a training state dict that are not client state
// (the ZeRO reader's names for the model-states file's own entries).
const std::set<std::string>& engine_entries() {
  static const std::set<std::string> k = {"model",          "optim",         "lr_scheduler", "global_steps",
                                          "global_samples", "skipped_steps", "client_state"};
  return k;
}

// A parameter name or state key becomes a folder or file name: refuse
// anything that is not one plain path component.
void require_component(const std::string& name, const std::string& what) {
  bool bad = name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
             name.find('\\') != std::string::npos || name.find('\0') != std::string::npos || name.size() > 255;
  if (bad)
    fail_invalid(what + " '" + name.substr(0, 200) +
                 "' cannot be a file or folder name of a universal checkpoint (zero/<name>/...)");
}

class Planner {
 public:
  Planner(const CheckpointModel& model, int world_size, std::optional<int> expert_parallel)
      : model_(model),
        world_size_(world_size),
        ep_known_(expert_parallel || model.info.parallel),
        ep_(expert_parallel       ? *expert_parallel
            : model.info.parallel ? std::max(1, model.info.parallel->expert)
                                  : 1) {}

  UniversalPlan plan() {
    if (model_.info.parallel && model_.info.parallel->tensor > 1 && !model_.info.tensor_parallel)
      fail(ErrorCode::kUnimplemented,
           model_.source + ": " + std::to_string(model_.info.parallel->tensor) +
               " tensor-parallel ranks that the checkpoint does not say how to merge (no "
               "universal_checkpoint_info): a universal checkpoint holds each parameter whole, and ckptconv does "
               "not concatenate slices on a guessed dimension");
    ValuePtr root = mapping_of(model_.root);
    if (!root || !root->is(Kind::kDict) || !root->get("model") || !root->get("optim"))
      fail_invalid(model_.source +
                   ": a universal checkpoint is written from a training state dict with 'model' and 'optim' "
                   "(model and optimizer state; not with --only)");
    ValuePtr module = mapping_of(root->get("model"));
    ValuePtr optim = mapping_of(root->get("optim"));
    ValuePtr state = optim && optim->is(Kind::kDict) ? mapping_of(optim->get("state")) : nullptr;
    ValuePtr groups = optim && optim->is(Kind::kDict) ? optim->get("param_groups") : nullptr;
    if (!module || !module->is(Kind::kDict) || !state || !state->is(Kind::kDict) || !groups ||
        !(groups->is(Kind::kList) || groups->is(Kind::kTuple)))
      fail_invalid(model_.source + ": 'model' must be a state dict and 'optim' hold 'state' and 'param_groups'");
    std::map<std::string, ValuePtr> states;
    for (const auto& [k, v] : state->entries) {
      if (!k->is(Kind::kStr))
        fail_invalid(model_.source + ": optim.state is keyed by parameter index (" + path_component(*k) +
                     "), not by name: a universal checkpoint needs each parameter's name (save the optimizer "
                     "with torch.distributed.checkpoint.state_dict.get_state_dict or FSDP.optim_state_dict)");
      states.emplace(k->text, v);
    }
    UniversalPlan out;
    if (!ep_known_) refuse_unknown_expert_parallelism(*module);
    if (ep_ > 1) count_experts(*module);
    std::set<std::string> written;
    std::map<std::size_t, std::string> owner_of;  // tensor index -> the first name it has
    for (const auto& [k, v] : module->entries) {
      const std::string name = path_component(*k);
      auto index = tensor_ref_index(*v);
      if (!index) {
        log::debug("model." + name + ": not a tensor, not written to the universal checkpoint");
        continue;
      }
      require_component(name, "parameter");
      if (!written.insert(name).second) continue;
      if (auto o = owner_of.emplace(*index, name); !o.second) shared_.emplace_back(name, o.first->second);
      const TensorEntry& t = model_.tensors.at(*index);
      if (t.storage == StorageKind::kBuffer)
        buffers_.push_back(name);
      else if (t.frozen)
        frozen_.emplace_back(name, t.shape);
      if (std::optional<zero::ExpertName> x = ep_ > 1 ? zero::parse_expert_name(name) : std::nullopt) {
        // Written once per local index, from every expert-parallel rank's expert of that index.
        const int local = local_experts(*x);
        const bool has_state = states.count(name) > 0;
        if (has_state) trainable_.emplace(name, t.shape);
        ++(has_state ? out.params : out.others);
        if (x->id < local) expert_files(out, *x, local, states);
        continue;
      }
      if (auto s = states.find(name); s != states.end()) {
        trainable_.emplace(name, t.shape);
        param_files(out, name, *index, s->second);
        ++out.params;
        states.erase(s);
      } else {
        // Frozen parameters, tied aliases and buffers: ds_to_universal
        // writes their fp32 value; no loader reads it.
        UniversalFile f = file("zero/" + name + "/fp32.pt");
        f.root = Value::dict({{Value::str("param"), add(f, *index)}});
        push(out, std::move(f));
        ++out.others;
      }
    }
    for (const auto& [name, index] : index_of_) states.erase(name);  // MoE experts: written above
    if (!states.empty())
      fail_invalid(model_.source + ": optim.state has '" + states.begin()->first.substr(0, 200) +
                   "', which is not a tensor of model");
    for (const auto& g : groups->as_sequence()) {
      ValuePtr group = mapping_of(g);
      ValuePtr params = group->is(Kind::kDict) ? group->get("params") : nullptr;
      auto shapes = Value::dict({}, true);
      if (params)
        for (const auto& p : params->as_sequence())
          if (auto it = trainable_.find(path_component(*p)); it != trainable_.end())
            shapes->entries.emplace_back(Value::str(it->first), size(it->second));
      param_shapes_.push_back(shapes);
    }
    push(out, optimizer_state(groups, *state));
    // The same file under both names every stage opens (ZeRO-1/2, ZeRO-3 rank 0).
    UniversalFile model_file = model_states(root, "mp_rank_00_model_states.pt");
    UniversalFile rank0_file = model_file;
    rank0_file.path = "zero_pp_rank_0_mp_rank_00_model_states.pt";
    push(out, std::move(model_file));
    push(out, std::move(rank0_file));
    return out;
  }

 private:
  UniversalFile file(const std::string& path) const {
    UniversalFile f;
    f.path = path;
    return f;
  }

  void push(UniversalPlan& out, UniversalFile f) const {
    out.tensor_bytes += f.tensor_bytes();
    out.files.push_back(std::move(f));
  }

  // Tensor `index` of the model as tensor i of `f`, cast to `dtype` (kept
  // when nullopt); its reference in f's tree.
  ValuePtr add(UniversalFile& f, std::size_t index, std::optional<DType> dtype = DType::kFloat32) const {
    const TensorEntry& t = model_.tensors.at(index);
    f.tensors.push_back({dtype.value_or(t.output_dtype()), t.shape});
    f.sources.push_back({index, false, {}, {}});
    return make_tensor_ref(f.tensors.size() - 1);
  }

  // A Python number (a step saved as an int) as a 0-d float32 tensor.
  ValuePtr add_literal(UniversalFile& f, double value) const {
    const auto bits = std::bit_cast<uint32_t>(static_cast<float>(value));
    std::string bytes(4, '\0');
    for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>(bits >> (8 * i) & 0xff);  // torch.save's little-endian
    f.tensors.push_back({DType::kFloat32, {}});
    f.sources.push_back({0, true, bytes, {}});
    return make_tensor_ref(f.tensors.size() - 1);
  }

  // A step (tensor or number) into `f`; nullptr when `v` is neither.
  ValuePtr step_value(UniversalFile& f, const Value& v) const {
    if (auto index = tensor_ref_index(v)) {
      if (model_.tensors.at(*index).numel() != 1) return nullptr;
      return add(f, *index);
    }
    if (v.is(Kind::kInt)) return add_literal(f, double(v.int_value));
    if (v.is(Kind::kFloat)) return add_literal(f, v.float_value);
    return nullptr;
  }

  // zero/<name>/: fp32.pt, one <key>.pt per state of the parameter's shape, step.pt.
  void param_files(UniversalPlan& out, const std::string& name, std::size_t param, const ValuePtr& state_entry) {
    const Value& state = *mapping_of(state_entry);
    const Shape& shape = model_.tensors.at(param).shape;
    auto sliced = [&](const std::string& key, std::size_t index) {
      UniversalFile f = file("zero/" + name + "/" + key + ".pt");
      ValuePtr ref = add(f, index);
      f.root = sliced_root(name, ref);
      push(out, std::move(f));
    };
    sliced("fp32", param);
    if (!state.is(Kind::kDict)) fail_invalid(model_.source + ": optim.state." + name + " is not a dict");
    for (const auto& [k, v] : state.entries) {
      const std::string key = path_component(*k);
      require_component(key, "optimizer state key of '" + name + "'");
      if (v->is(Kind::kNone)) continue;  // SGD's momentum_buffer before the first step
      if (key == "step") {
        UniversalFile f = file("zero/" + name + "/step.pt");
        f.root = step_value(f, *v);
        if (!f.root) fail_invalid(model_.source + ": optim.state." + name + ".step is not a number");
        push(out, std::move(f));
        continue;
      }
      auto index = tensor_ref_index(*v);
      if (key == "fp32" || !index || model_.tensors.at(*index).shape != shape)
        fail_invalid(
            model_.source + ": optim.state." + name + "." + key +
            (index ? " has shape " + shape_str(model_.tensors.at(*index).shape) + ", the parameter " + shape_str(shape)
                   : std::string(" is not a tensor")) +
            ": a universal checkpoint holds per-parameter states of the parameter's shape");
      sliced(key, *index);
    }
  }

  // A parameter's {'cat_dim': 0, 'param': ...}; of a tensor-parallel source
  // merged by its patterns (TensorParallelLayout), what ds_to_universal.py's
  // merge_tp_slices writes for its category, so that a loader at any
  // tensor-parallel degree cuts it the same way (universal_checkpoint.py
  // load_hp_checkpoint_state): no cat_dim for a replicated one (the loader
  // keeps a tensor of its own shape whole), param_n_sub_params 2 for two
  // sub-parameters, vocab_tensor for the vocabulary (re-padded at load).
  ValuePtr sliced_root(const std::string& name, const ValuePtr& ref) const {
    const TensorParallelMerge* m = nullptr;
    if (model_.info.tensor_parallel)
      if (auto it = model_.info.tensor_parallel->params.find(name); it != model_.info.tensor_parallel->params.end())
        m = &it->second;
    auto d = Value::dict();
    using MergeKind = TensorParallelMerge::Kind;
    if (!m || m->kind != MergeKind::kReplicated)
      d->entries.emplace_back(Value::str("cat_dim"), Value::integer(m && m->kind == MergeKind::kCat ? m->cat_dim : 0));
    if (m && m->kind == MergeKind::kTwoSubParams)
      d->entries.emplace_back(Value::str("param_n_sub_params"), Value::integer(2));
    if (m && m->vocabulary) d->entries.emplace_back(Value::str("vocab_tensor"), Value::boolean(true));
    d->entries.emplace_back(Value::str("param"), ref);
    return d;
  }

  // MoE: how many experts each MoE layer (expert name prefix) has, from the
  // global ids the model's names carry.
  void count_experts(const Value& module) {
    for (const auto& [k, v] : module.entries) {
      std::string name = path_component(*k);
      auto index = tensor_ref_index(*v);
      std::optional<zero::ExpertName> x = zero::parse_expert_name(name);
      if (!index || !x) continue;
      index_of_.emplace(name, *index);
      int& n = num_experts_[x->prefix];
      n = std::max(n, x->id + 1);
    }
  }

  // A source that does not record the expert-parallel size (a consolidated
  // file, DCP) but names DeepSpeed experts: the folders' names depend on the
  // ep_size of the engine that will load them (by global id at 1, stacked
  // by local index above), and a guess loads rank 0's experts on every
  // expert-parallel rank without an error. So the size must be given.
  void refuse_unknown_expert_parallelism(const Value& module) const {
    for (const auto& [k, v] : module.entries)
      if (zero::parse_expert_name(path_component(*k)))
        fail(ErrorCode::kUnimplemented,
             model_.source + " names DeepSpeed MoE experts ('" + path_component(*k).substr(0, 200) +
                 "') but does not record the expert-parallel size, and a universal checkpoint's expert folders "
                 "depend on the ep_size of the engine that loads it: give it with --expert-parallel N (1 keys "
                 "experts by global id)");
  }

  // Local experts per expert-parallel rank of x's MoE layer.
  int local_experts(const zero::ExpertName& x) const {
    const int n = num_experts_.at(x.prefix);
    if (n % ep_ != 0)
      fail(ErrorCode::kUnimplemented, model_.source + ": " + std::to_string(n) + " experts under '" + x.prefix +
                                          "' do not divide over expert-parallel size " + std::to_string(ep_));
    return n / ep_;
  }

  // zero/<x with local id x.id>/: each file the stack of the ep experts
  // x.id, local + x.id, ... (see plan_universal in the header).
  void expert_files(UniversalPlan& out, const zero::ExpertName& x, int local,
                    const std::map<std::string, ValuePtr>& states) {
    std::vector<std::string> names;
    std::vector<std::size_t> params;
    for (int e = 0; e < ep_; ++e) {
      names.push_back(x.with_id(e * local + x.id));
      auto it = index_of_.find(names.back());
      if (it == index_of_.end())
        fail(ErrorCode::kNotFound, model_.source + ": '" + names.back() + "' (expert " +
                                       std::to_string(e * local + x.id) + " of '" + x.prefix + "') is missing");
      params.push_back(it->second);
    }
    const std::string dir = "zero/" + x.with_id(x.id) + "/";
    auto expert_dict = [&](UniversalFile& f, const std::vector<std::size_t>& parts, bool sliced) {
      auto d = Value::dict({});
      if (sliced) d->entries.emplace_back(Value::str("cat_dim"), Value::integer(0));
      d->entries.emplace_back(Value::str("param"), add_stacked(f, parts));
      d->entries.emplace_back(Value::str("is_expert_param"), Value::boolean(true));
      d->entries.emplace_back(Value::str("ep_num_experts"), Value::integer(ep_));
      return d;
    };
    auto first = states.find(names[0]);
    if (first == states.end()) {  // frozen: what ds_to_universal writes for those, never loaded
      UniversalFile f = file(dir + "fp32.pt");
      f.root = expert_dict(f, params, false);
      push(out, std::move(f));
      return;
    }
    UniversalFile fp32 = file(dir + "fp32.pt");
    fp32.root = expert_dict(fp32, params, true);
    push(out, std::move(fp32));
    const Value& state = *mapping_of(first->second);
    if (!state.is(Kind::kDict)) fail_invalid(model_.source + ": optim.state." + names[0] + " is not a dict");
    for (const auto& [k, v] : state.entries) {
      const std::string key = path_component(*k);
      require_component(key, "optimizer state key of '" + names[0] + "'");
      if (v->is(Kind::kNone)) continue;
      UniversalFile f = file(dir + key + ".pt");
      if (key == "step") {  // one per param group: the first expert's
        f.root = step_value(f, *v);
        if (!f.root) fail_invalid(model_.source + ": optim.state." + names[0] + ".step is not a number");
        push(out, std::move(f));
        continue;
      }
      std::vector<std::size_t> parts;
      for (const auto& n : names) {
        auto s = states.find(n);
        ValuePtr m = s == states.end() ? nullptr : mapping_of(s->second);
        ValuePtr t = m && m->is(Kind::kDict) ? m->get(key) : nullptr;
        auto index = t ? tensor_ref_index(*t) : std::nullopt;
        if (key == "fp32" || !index || model_.tensors.at(*index).shape != model_.tensors.at(params[0]).shape)
          fail_invalid(model_.source + ": optim.state." + n + "." + key +
                       " is not a tensor of the parameter's shape: a universal checkpoint holds per-parameter "
                       "states of the parameter's shape");
        parts.push_back(*index);
      }
      f.root = expert_dict(f, parts, true);
      push(out, std::move(f));
    }
  }

  // Tensors `parts` of the model stacked as one fp32 tensor of f.
  ValuePtr add_stacked(UniversalFile& f, const std::vector<std::size_t>& parts) const {
    Shape shape = model_.tensors.at(parts[0]).shape;
    shape.insert(shape.begin(), int64_t(parts.size()));
    f.tensors.push_back({DType::kFloat32, shape});
    f.sources.push_back({parts[0], false, {}, parts});
    return make_tensor_ref(f.tensors.size() - 1);
  }

  // The step of group g: its first parameter's.
  const Value* group_step(const Value& group, const Value& state) const {
    ValuePtr params = group.is(Kind::kDict) ? group.get("params") : nullptr;
    if (!params) return nullptr;
    for (const auto& p : params->as_sequence()) {
      if (!p->is(Kind::kStr)) continue;
      ValuePtr s = state.get(p->text);
      if (!s) continue;
      ValuePtr m = mapping_of(s);
      if (ValuePtr step = m->is(Kind::kDict) ? m->get("step") : nullptr) return step.get();
    }
    return nullptr;
  }

  // Hyper-parameters of every group, 'params' replaced by the group's index
  // (what ds_to_universal writes; ZeRO-1/2 assign each group its own).
  UniversalFile optimizer_state(const ValuePtr& groups, const Value& state) const {
    UniversalFile f = file("zero/optimizer_state.pt");
    std::map<const Value*, ValuePtr> done;
    auto param_groups = Value::list({});
    auto steps = Value::dict();
    const auto& seq = groups->as_sequence();
    for (std::size_t g = 0; g < seq.size(); ++g) {
      ValuePtr group = mapping_of(seq[g]);
      if (!group->is(Kind::kDict))
        fail_invalid(model_.source + ": optim.param_groups." + std::to_string(g) + " is not a dict");
      auto copy = Value::dict();
      for (const auto& [k, v] : group->entries)  // hyper-parameters (a tensor lr too)
        if (!k->is(Kind::kStr) || k->text != "params") copy->entries.emplace_back(k, carry(f, v, done));
      copy->entries.emplace_back(Value::str("params"), Value::list({Value::integer(int64_t(g))}));
      param_groups->items.push_back(copy);
      if (const Value* step = group_step(*group, state))
        if (ValuePtr ref = step_value(f, *step))
          steps->entries.emplace_back(Value::integer(int64_t(g)), Value::dict({{Value::str("step"), ref}}));
    }
    // ZeRO-3 takes its step from state[0] and every group's hyper-parameters
    // from param_groups[0] of optimizer_state_dict, as with ds_to_universal's output.
    auto osd = Value::dict({{Value::str("state"), steps}, {Value::str("param_groups"), param_groups}});
    f.root = Value::dict({{Value::str("ds_version"), Value::str(ds_version())},
                          {Value::str("param_groups"), param_groups},
                          {Value::str("optimizer_state_dict"), osd}});
    return f;
  }

  std::string ds_version() const {
    auto it = model_.facts.find("ds_version");
    return it != model_.facts.end() && !it->second.empty() ? it->second : kDsVersion;
  }

  // `v` with its tensor references renumbered into f's tensors (dtype kept).
  ValuePtr carry(UniversalFile& f, const ValuePtr& v, std::map<const Value*, ValuePtr>& done) const {
    if (auto it = done.find(v.get()); it != done.end()) return it->second;
    ValuePtr out;
    if (auto index = tensor_ref_index(*v)) {
      out = add(f, *index, std::nullopt);
    } else {
      out = std::make_shared<Value>(*v);
      for (auto& item : out->items) item = carry(f, item, done);
      for (auto& [key, value] : out->entries) value = carry(f, value, done);
      if (out->args) out->args = carry(f, out->args, done);
      if (out->object) out->object = carry(f, out->object, done);
      if (out->state) out->state = carry(f, out->state, done);
    }
    done.emplace(v.get(), out);
    return out;
  }

  // What the engine reads from the model-states file with load_universal
  // (engine.py _load_checkpoint): dp_world_size, mp_world_size,
  // global_steps, skipped_steps, global_samples (optional), lr_scheduler
  // (when the engine has one); every other entry comes back as client state.
  UniversalFile model_states(const ValuePtr& root, const std::string& name) const {
    UniversalFile f = file(name);
    std::map<const Value*, ValuePtr> done;
    auto d = Value::dict();
    auto put = [&](const std::string& key, ValuePtr v) { d->entries.emplace_back(Value::str(key), std::move(v)); };
    auto count = [&](const char* key) -> ValuePtr {
      ValuePtr v = root->get(key);
      return v && v->is(Kind::kInt) ? v : nullptr;
    };
    if (ValuePtr s = root->get("lr_scheduler"); s && !s->is(Kind::kNone)) put("lr_scheduler", carry(f, s, done));
    put("dp_world_size", Value::integer(world_size_));
    put("mp_world_size", Value::integer(1));
    put("global_steps", count("global_steps") ? count("global_steps") : Value::integer(0));
    put("skipped_steps", count("skipped_steps") ? count("skipped_steps") : Value::integer(0));
    if (ValuePtr v = count("global_samples")) put("global_samples", v);
    put("ds_version", Value::str(ds_version()));
    // What DeepSpeed's model-states files say of the model, under its names
    // (the universal load does not read them; readers of the checkpoint,
    // ckptconv's among them, learn groups and roles from them).
    put("param_shapes", Value::list(param_shapes_));
    auto frozen = Value::dict({}, true);
    for (const auto& [n, shape] : frozen_) frozen->entries.emplace_back(Value::str(n), size(shape));
    put("frozen_param_shapes", frozen);
    auto buffers = Value::list({});
    for (const auto& n : buffers_) buffers->items.push_back(Value::str(n));
    put("buffer_names", buffers);
    auto shared = Value::dict();
    for (const auto& [alias, owner] : shared_) shared->entries.emplace_back(Value::str(alias), Value::str(owner));
    put("shared_params", shared);
    // Client state: DeepSpeed merges save_checkpoint(client_state=...) into
    // the file's top level; other sources' extra entries go there too.
    if (ValuePtr client = root->get("client_state"); client && mapping_of(client)->is(Kind::kDict))
      for (const auto& [k, v] : mapping_of(client)->entries) d->entries.emplace_back(k, carry(f, v, done));
    for (const auto& [k, v] : root->entries)
      if (!k->is(Kind::kStr) || !engine_entries().count(k->text)) d->entries.emplace_back(k, carry(f, v, done));
    f.root = d;
    return f;
  }

  // torch.Size(shape), as DeepSpeed's param_shapes hold them.
  static ValuePtr size(const Shape& shape) {
    std::vector<ValuePtr> dims;
    for (int64_t d : shape) dims.push_back(Value::integer(d));
    return Value::call(Value::global("torch", "Size"), Value::tuple({Value::tuple(std::move(dims))}));
  }

  const CheckpointModel& model_;
  int world_size_;
  bool ep_known_;                                            // given, or recorded by the source
  int ep_;                                                   // expert-parallel size to write for
  std::map<std::string, int> num_experts_;                   // MoE: per expert name prefix
  std::map<std::string, std::size_t> index_of_;              // MoE: expert entry name -> tensor
  std::map<std::string, Shape> trainable_;                   // parameters with optimizer state
  std::vector<ValuePtr> param_shapes_;                       // per param group: {fqn: torch.Size}
  std::vector<std::pair<std::string, Shape>> frozen_;        // frozen parameters, module order
  std::vector<std::string> buffers_;                         // buffers, module order
  std::vector<std::pair<std::string, std::string>> shared_;  // tied alias -> owner
};

}  // namespace

UniversalPlan plan_universal(const CheckpointModel& model, int source_world_size, std::optional<int> expert_parallel) {
  require_distinct_paths(*model.root, "a universal checkpoint");
  return Planner(model, source_world_size, expert_parallel).plan();
}

}  // namespace ckpt::ds_universal
