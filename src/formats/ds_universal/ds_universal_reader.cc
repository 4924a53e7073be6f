#include "formats/ds_universal/ds_universal_reader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/linear_regex.h"
#include "core/log.h"
#include "formats/latest_file.h"
#include "formats/pyobj.h"
#include "formats/torch_pt/pt_reader.h"
#include "formats/zero/moe_experts.h"
#include "formats/zero/zero_files.h"
#include "io/containment.h"
#include "io/storage.h"
#include "model/flat_range.h"
#include "model/tree_walk.h"

namespace ckpt::ds_universal {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using zero::Decoded;

constexpr const char* kModelStates = "mp_rank_00_model_states.pt";                 // ZeRO-1/2's, and ckptconv's
constexpr const char* kRank0States = "zero_pp_rank_0_mp_rank_00_model_states.pt";  // ZeRO-3's rank 0

bool is_tag(const fs::path& dir) {
  return is_regular_file((dir / "zero" / "optimizer_state.pt").string()) &&
         (is_regular_file((dir / kModelStates).string()) || is_regular_file((dir / kRank0States).string()));
}

std::string tag_dir(const std::string& src) {
  if (is_tag(src)) return src;
  std::optional<std::string> tag = read_latest_tag(fs::path(src) / "latest_universal");
  if (!tag) fail(ErrorCode::kNotFound, src + ": no zero/optimizer_state.pt and no latest_universal");
  fs::path dir = fs::path(src) / *tag;
  if (!is_tag(dir))
    fail(ErrorCode::kNotFound,
         src + ": latest_universal names '" + *tag + "', which is not a universal checkpoint here");
  require_inside(dir.string(), src);
  return dir.string();
}

// A per-parameter file: a tensor, or a dict holding it under 'param'
// (ds_to_universal's ZeRO-1/2 files and ckptconv's).
Decoded decode_tensor_file(const std::string& path, ProblemSink* problems) {
  Decoded d;
  d.path = path;
  d.root = torch_pt::decode_archive(open_mapped_source(path), d.tensors, "", -1, problems);
  if (!d.root) fail_data_loss(path + ": empty pickle");
  return d;
}

const Value& tensor_value(const Decoded& d) {
  const Value& root = zero::as_dict(*d.root);
  if (root.is(Kind::kDict)) return *zero::at(root, "param", d.path);
  return *d.root;
}

class UniversalReader {
 public:
  UniversalReader(std::string dir, ProblemSink* problems, std::string only)
      : dir_(std::move(dir)), problems_(problems), only_(std::move(only)) {}

  CheckpointModel read() {
    fs::path states = fs::path(dir_) / kModelStates;
    if (!stat_path(states.string()).resolves()) states = fs::path(dir_) / kRank0States;
    states_ = zero::decode(states.string(), 0, problems_, only_);
    optim_ = zero::decode((fs::path(dir_) / "zero" / "optimizer_state.pt").string(), -1, problems_, only_);
    files_ = {states_.path, optim_.path};
    read_description();
    list_folders();
    CheckpointModel model;
    model.source = dir_;
    build(model);
    zero::add_training_state(model, states_);
    model.info.kind = SourceKind::kDsUniversal;
    model.info.records_frozen = true;
    std::sort(files_.begin(), files_.end());
    // ZeRO-3's rank-0 states file is read as the model states and again
    // among the ranks' frozen fragments: one file, listed once.
    files_.erase(std::unique(files_.begin(), files_.end()), files_.end());
    model.info.files = files_;
    int ws = 1;
    if (ValuePtr dp = states_.root->get("dp_world_size"); dp && dp->is(Kind::kInt) && dp->int_value > 0)
      ws = int(dp->int_value);
    model.info.world_sizes = {ws};
    // Stacked experts say the expert-parallel size: writing this checkpoint
    // as a universal checkpoint again stacks them the same way.
    if (expert_parallel_ > 1) model.info.parallel = ParallelDegrees{.data = ws, .expert = expert_parallel_};
    // The categories its fp32.pt files record: written as a universal
    // checkpoint again, each parameter keeps them (without them a loader at
    // tensor-parallel degree 2 cuts a row-parallel weight along dim 0).
    if (tensor_parallel_.has_value()) model.info.tensor_parallel = std::move(tensor_parallel_);
    model.facts["saved_at_world_size"] = std::to_string(ws);
    if (ValuePtr v = optim_.root->get("ds_version"); v && v->is(Kind::kStr)) model.facts["ds_version"] = v->text;
    model.facts["tag"] = fs::path(dir_).filename().string();
    return model;
  }

 private:
  // param_shapes (per group or ZeRO-3 sub-group), frozen_param_shapes,
  // buffer_names, shared_params and module, where the model-states file has them.
  void read_description() {
    const Value& root = *states_.root;
    if (ValuePtr shapes = root.get("param_shapes"); shapes && !shapes->is(Kind::kNone))
      for (const auto& group : shapes->as_sequence()) {
        const Value& g = zero::as_dict(*group);
        if (!g.is(Kind::kDict)) fail_data_loss(states_.path + ": param_shapes holds a " + kind_name(g.kind));
        groups_.emplace_back();
        for (const auto& [k, v] : g.entries) {
          groups_.back().push_back(k->as_str());
          shapes_[k->as_str()] = pyobj::int_sequence(*v, "param shape");
          sub_group_[k->as_str()] = groups_.size() - 1;
        }
      }
    if (ValuePtr frozen = root.get("frozen_param_shapes"); frozen && zero::as_dict(*frozen).is(Kind::kDict))
      for (const auto& [k, v] : zero::as_dict(*frozen).entries) {
        frozen_order_.push_back(k->as_str());
        frozen_shapes_[k->as_str()] = pyobj::int_sequence(*v, "frozen param shape");
      }
    if (ValuePtr buffers = root.get("buffer_names"); buffers && buffers->is(Kind::kList))
      for (const auto& b : buffers->items) {
        buffers_.push_back(b->as_str());
        buffer_set_.insert(buffers_.back());
      }
    if (ValuePtr shared = root.get("shared_params"); shared && zero::as_dict(*shared).is(Kind::kDict))
      for (const auto& [k, v] : zero::as_dict(*shared).entries) {
        shared_.emplace_back(k->as_str(), v->as_str());
        owners_.emplace(shared_.back().first, shared_.back().second);
      }
    // Copied from a tensor-parallel run (Megatron-DeepSpeed through
    // ds_to_universal): param_shapes and module are tensor-parallel rank 0's,
    // slices; the zero/ folders hold the parameters whole.
    if (ValuePtr mp = root.get("mp_world_size"); mp && mp->is(Kind::kInt) && mp->int_value > 1)
      slices_of_rank0_ = int(mp->int_value);
    if (ValuePtr m = root.get("module"); m && zero::as_dict(*m).is(Kind::kDict)) {
      module_ = m;
      module_index_ = name_index(zero::as_dict(*m));
    }
  }

  // zero/<fqn>/ and the .pt files in each.
  void list_folders() {
    const std::string zero = (fs::path(dir_) / "zero").string();
    if (!is_directory(zero)) fail(ErrorCode::kNotFound, zero + ": cannot list: not a directory");
    for (const DirEntry& e : list_directory(zero)) {
      if (!e.is_directory() || e.link) continue;
      std::set<std::string>& files = folders_[e.name];
      for (const DirEntry& f : list_directory(e.path)) {
        if (!f.name.ends_with(".pt") || !f.is_file()) continue;
        require_inside(f.path, dir_);
        files.insert(f.name.substr(0, f.name.size() - 3));
      }
    }
  }

  bool trainable(const std::string& name) const {
    if (shapes_.count(name)) return true;
    auto it = folders_.find(name);
    return it != folders_.end() &&
           std::any_of(it->second.begin(), it->second.end(), [](const std::string& f) { return f != "fp32"; });
  }

  std::string file_of(const std::string& name, const std::string& key) const {
    return (fs::path(dir_) / "zero" / name / (key + ".pt")).string();
  }

  // MoE experts stacked by local index (ckptconv's universal checkpoints of
  // a run at expert-parallel size ep > 1, ds_universal_writer.h): folder
  // deepspeed_experts.i holds global experts i, L + i, ... along a new first
  // dimension, L the folders of the layer. Global expert g is entry g / L of
  // folder g % L. nullopt: `name` is read as it is.
  struct StackedSlot {
    std::string folder;
    int entry = 0;
    int count = 0;  // the entries the file must hold (ep)
  };
  std::optional<StackedSlot> stacked_slot(const std::string& name) {
    std::optional<zero::ExpertName> x = zero::parse_expert_name(name);
    if (!x) return std::nullopt;
    if (!expert_counts_) {  // once: a scan per name would be quadratic
      expert_counts_.emplace();
      for (const auto& [n, shape] : shapes_)
        if (auto y = zero::parse_expert_name(n)) (*expert_counts_)[y->prefix + '\0' + y->rest].first.insert(y->id);
      for (const auto& [n, files] : folders_)
        if (auto y = zero::parse_expert_name(n)) (*expert_counts_)[y->prefix + '\0' + y->rest].second.insert(y->id);
    }
    auto it = expert_counts_->find(x->prefix + '\0' + x->rest);
    if (it == expert_counts_->end()) return std::nullopt;
    const int n = int(it->second.first.size()), l = int(it->second.second.size());
    if (l == 0 || l >= n || n % l != 0) return std::nullopt;
    return StackedSlot{x->with_id(x->id % l), x->id / l, n / l};
  }

  // Entry `slot.entry` of a stacked expert tensor `t` (its first dimension).
  void take_stacked(TensorEntry& t, const StackedSlot& slot, const Decoded& d, const std::string& out_name) const {
    if (t.shape.empty() || t.shape[0] != slot.count || t.chunks.size() != 1)
      fail_data_loss(d.path + ": '" + out_name + "' has shape " + shape_str(t.shape) + ", not " +
                     std::to_string(slot.count) + " experts stacked");
    TensorChunk& c = t.chunks[0];
    c.storage_offset += int64_t(slot.entry) * c.strides[0];
    c.offsets.erase(c.offsets.begin());
    c.sizes.erase(c.sizes.begin());
    c.strides.erase(c.strides.begin());
    t.shape.erase(t.shape.begin());
  }

  static bool is_expert_file(const Decoded& d) {
    const Value& root = zero::as_dict(*d.root);
    ValuePtr flag = root.is(Kind::kDict) ? root.get("is_expert_param") : nullptr;
    return flag && flag->is(Kind::kBool) && flag->bool_value;
  }

  // Tensor `key` of parameter `name` (its folder's <key>.pt), shaped `shape`
  // when the file holds it flat (ZeRO-3); nullopt without the file.
  std::optional<std::size_t> param_tensor(CheckpointModel& model, const std::string& name, const std::string& key,
                                          const std::optional<Shape>& shape, const std::string& out_name) {
    std::optional<StackedSlot> slot = stacked_slot(name);
    const std::string folder = slot ? slot->folder : name;
    auto f = folders_.find(folder);
    if (f == folders_.end() || !f->second.count(key)) return std::nullopt;
    Decoded d = decode_tensor_file(file_of(folder, key), problems_);
    files_.push_back(d.path);
    std::size_t idx = zero::copy_tensor(model, d, tensor_value(d), out_name);
    TensorEntry& t = model.tensors[idx];
    if (key == "fp32" && !is_expert_file(d)) record_merge(name, d, shape ? shape->size() : t.shape.size());
    if (is_expert_file(d)) {
      if (!slot)
        fail(ErrorCode::kUnimplemented, d.path +
                                            ": an expert parameter stacked over expert-parallel ranks, but the "
                                            "checkpoint's param_shapes do not name the experts it stacks");
      take_stacked(t, *slot, d, out_name);
      expert_parallel_ = std::max(expert_parallel_, slot->count);
    }
    if (shape && t.shape != *shape) {
      // ds_to_universal's ZeRO-3 files hold the parameter flat: its elements
      // as the shape param_shapes gives (add_range refuses anything not flat).
      if (shape_numel(t.shape) != shape_numel(*shape))
        fail_data_loss(d.path + ": '" + out_name + "' has shape " + shape_str(t.shape) + ", param_shapes says " +
                       shape_str(*shape));
      TensorEntry flat = t;
      t.shape = *shape;
      t.chunks.clear();
      add_flat_range(t, flat, 0, 0, shape_numel(*shape), -1, d.path + ": '" + out_name + "'");
    }
    return idx;
  }

  // A whole parameter of a tensor-parallel run against rank 0's slice
  // param_shapes names: each dimension the slice's, or up to the ranks' sum
  // (the dimension it is cut along; a vocabulary's padding is cut off).
  void check_holds_slice(const std::string& name, const Shape& whole) const {
    auto s = shapes_.find(name);
    if (s == shapes_.end()) return;
    const Shape& slice = s->second;
    bool fits = slice.size() == whole.size();
    for (std::size_t i = 0; fits && i < slice.size(); ++i)
      fits = whole[i] == slice[i] || (whole[i] > slice[i] && whole[i] <= slice[i] * slices_of_rank0_);
    if (!fits)
      fail_data_loss(dir_ + ": zero/" + name + "/fp32.pt has shape " + shape_str(whole) + ", not a whole of the " +
                     shape_str(slice) + " slices param_shapes names (tensor-parallel size " +
                     std::to_string(slices_of_rank0_) + ")");
  }

  // How a loader at any tensor-parallel degree cuts parameter `name`, as
  // its fp32.pt says (load_hp_checkpoint_state in DeepSpeed's
  // universal_checkpoint.py): no cat_dim, kept whole (replicated);
  // param_n_sub_params 2, each half cut on dim 0; else cut on cat_dim;
  // vocab_tensor, re-padded. Only a checkpoint with some parameter not cut
  // plainly on dim 0 (all a source without tensor parallelism has) gets a
  // layout, so a data-parallel one reads as it did.
  void record_merge(const std::string& name, const Decoded& d, std::size_t rank) {
    const Value& root = zero::as_dict(*d.root);
    if (!root.is(Kind::kDict)) return;  // a bare tensor: ds_to_universal's ZeRO-3 files, cut on dim 0
    using MergeKind = TensorParallelMerge::Kind;
    TensorParallelMerge m;
    ValuePtr cat = root.get("cat_dim");
    ValuePtr subs = root.get("param_n_sub_params");
    ValuePtr vocab = root.get("vocab_tensor");
    if (!cat) {
      m.kind = MergeKind::kReplicated;
    } else if (subs) {
      if (!subs->is(Kind::kInt) || subs->int_value != 2)
        fail(ErrorCode::kUnimplemented, d.path + ": param_n_sub_params " + value_text(*subs) +
                                            " (DeepSpeed's universal loader cuts 2 sub-parameters)");
      m.kind = MergeKind::kTwoSubParams;
    } else {
      // A dimension of the parameter: a loader at any tensor-parallel degree
      // cuts it there (torch.chunk), so one past its rank fails there, not here.
      if (!cat->is(Kind::kInt) || cat->int_value < 0 || cat->int_value >= int64_t(rank))
        fail_data_loss(d.path + ": cat_dim " + value_text(*cat) + " is not a dimension of the " + std::to_string(rank) +
                       "-dimensional parameter");
      m.cat_dim = int(cat->int_value);
    }
    m.vocabulary = vocab && vocab->is(Kind::kBool) && vocab->bool_value;
    // A parameter the layout does not name is written cut on dim 0.
    if (m.kind == MergeKind::kCat && m.cat_dim == 0 && !m.vocabulary) return;
    if (!tensor_parallel_) tensor_parallel_.emplace();
    tensor_parallel_->params[name] = m;
  }

  static std::string value_text(const Value& v) {
    return v.is(Kind::kInt) ? std::to_string(v.int_value) : std::string("(not an int)");
  }

  // The step of a parameter with no step.pt: optimizer_state.pt's
  // optimizer_state_dict.state[k].step, k its sub-group (ds_to_universal's ZeRO-3 path).
  std::optional<std::size_t> saved_step(CheckpointModel& model, const std::string& name) {
    if (!step_states_) {
      step_states_.emplace();
      ValuePtr osd = zero::as_dict(*optim_.root).get("optimizer_state_dict");
      ValuePtr state = osd ? zero::as_dict(*osd).get("state") : nullptr;
      if (state)
        for (const auto& [key, v] : zero::as_dict(*state).entries)
          if (key->is(Kind::kInt)) step_states_->emplace(key->int_value, v);
    }
    auto sub = sub_group_.find(name);
    const int64_t k = sub == sub_group_.end() ? 0 : int64_t(sub->second);
    auto found = step_states_->find(k);
    if (found == step_states_->end()) return std::nullopt;
    ValuePtr step = zero::as_dict(*found->second).get("step");
    if (!step || !tensor_ref_index(*step)) return std::nullopt;
    return zero::copy_tensor(model, optim_, *step, "optim.state." + name + ".step");
  }

  // Names in the module's order where the model-states file has `module`
  // (DeepSpeed's); else trainable, frozen, buffers, aliases as described;
  // then any other folder, sorted.
  std::vector<std::string> order() const {
    std::vector<std::string> out;
    std::set<std::string> seen;
    auto add = [&](const std::string& n) {
      if (seen.insert(n).second) out.push_back(n);
    };
    if (module_) {
      for (const auto& [k, v] : zero::as_dict(*module_).entries)
        if (k->is(Kind::kStr)) add(k->text);
    } else {
      for (const auto& g : groups_)
        for (const auto& n : g) add(n);
      for (const auto& n : frozen_order_) add(n);
      for (const auto& n : buffers_) add(n);
      for (const auto& [alias, owner] : shared_) add(alias);
    }
    for (const auto& [n, files] : folders_) add(n);
    return out;
  }

  // Looked up once per name: a model lists 10^4-10^5 names, so every lookup
  // goes through an index (a scan per name was quadratic: 25 s at 40k).
  std::optional<std::string> owner_of(const std::string& name) const {
    auto it = owners_.find(name);
    return it == owners_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }

  bool is_buffer(const std::string& name) const { return buffer_set_.count(name) > 0; }

  // A dict's str keys to their values; the first of a repeated key wins, as
  // Value::get finds it.
  static std::unordered_map<std::string, ValuePtr> name_index(const Value& dict) {
    std::unordered_map<std::string, ValuePtr> out;
    out.reserve(dict.entries.size());
    for (const auto& [k, v] : dict.entries)
      if (k->is(Kind::kStr)) out.emplace(k->text, v);
    return out;
  }

  // A frozen parameter or buffer: the module's value as saved, ZeRO-3's
  // fragments, or its fp32.pt; nullopt when the checkpoint has none.
  std::optional<std::size_t> other_tensor(CheckpointModel& model, const std::string& name) {
    const std::string out_name = "model." + name;
    if (module_) {
      auto found = module_index_.find(name);
      ValuePtr v = found == module_index_.end() ? nullptr : found->second;
      if (v && tensor_ref_index(*v) && states_.tensor(*v, states_.path).numel() > 0) {
        // Tensor-parallel rank 0's value: the whole tensor only if it is
        // replicated, which nothing in the files says.
        if (slices_of_rank0_ && !is_buffer(name))
          fail(ErrorCode::kUnimplemented, states_.path + ": frozen parameter '" + name +
                                              "' is tensor-parallel rank 0's of " + std::to_string(slices_of_rank0_) +
                                              " (mp_world_size), and nothing says whether it is split");
        return zero::copy_tensor(model, states_, *v, out_name);
      }
    }
    if (frozen_shapes_.count(name))
      if (auto idx = from_fragments(model, name)) return idx;
    return param_tensor(model, name, "fp32", std::nullopt, out_name);
  }

  // ZeRO-3 frozen parameters: ceil(numel/ws) elements in each rank's
  // frozen_param_fragments, in the per-rank model-states files DeepSpeed's
  // converter copied.
  std::optional<std::size_t> from_fragments(CheckpointModel& model, const std::string& name) {
    static const LinearRegex rank_re = LinearRegex::compile(R"(^zero_pp_rank_(\d{1,6})_mp_rank_00_model_states\.pt$)");
    if (rank_states_.empty()) {
      std::map<int, std::string> found;
      for (const DirEntry& e : list_directory(dir_)) {
        RegexMatch m;
        if (rank_re.match(e.name, m)) found[std::stoi(m.str(1))] = e.path;
      }
      if (found.empty() || found.rbegin()->first + 1 != int(found.size())) return std::nullopt;
      for (const auto& [r, path] : found) {
        rank_states_.push_back(zero::decode(path, r, problems_, only_));
        files_.push_back(path);
        ValuePtr all = zero::as_dict(*rank_states_.back().root).get("frozen_param_fragments");
        fragments_.push_back(all && zero::as_dict(*all).is(Kind::kDict) ? name_index(zero::as_dict(*all))
                                                                        : std::unordered_map<std::string, ValuePtr>{});
      }
    }
    std::vector<const TensorEntry*> frags;
    std::vector<std::string> paths;
    for (std::size_t r = 0; r < rank_states_.size(); ++r) {
      const Decoded& m = rank_states_[r];
      auto found = fragments_[r].find(name);
      ValuePtr frag = found == fragments_[r].end() ? nullptr : found->second;
      if (!frag || !tensor_ref_index(*frag)) return std::nullopt;
      frags.push_back(&m.tensor(*frag, m.path));
      paths.push_back(m.path);
    }
    TensorEntry t;
    t.name = "model." + name;
    t.shape = frozen_shapes_.at(name);
    t.dtype = frags[0]->dtype;
    zero::add_stage3_fragments(t, frags, paths);
    model.tensors.push_back(std::move(t));
    return model.tensors.size() - 1;
  }

  void build(CheckpointModel& model) {
    auto model_dict = Value::dict({}, true);
    auto state = Value::dict();
    std::map<std::string, ValuePtr> refs;
    std::vector<std::string> names = order(), trained;
    for (const auto& name : names) {
      if (owner_of(name)) continue;  // tied aliases: their owner's tensor, below
      std::optional<std::size_t> idx;
      if (trainable(name)) {
        std::optional<Shape> shape;
        if (auto s = shapes_.find(name); s != shapes_.end() && !slices_of_rank0_) shape = s->second;
        idx = param_tensor(model, name, "fp32", shape, "model." + name);
        if (!idx) fail_data_loss(dir_ + ": no zero/" + name + "/fp32.pt for trainable parameter '" + name + "'");
        if (slices_of_rank0_) check_holds_slice(name, model.tensors[*idx].shape);
        shape = model.tensors[*idx].shape;
        auto per_param = Value::dict();
        std::optional<std::size_t> step =
            param_tensor(model, name, "step", std::nullopt, "optim.state." + name + ".step");
        if (!step) step = saved_step(model, name);
        if (step) per_param->entries.emplace_back(Value::str("step"), make_tensor_ref(*step));
        std::vector<std::string> keys;
        std::optional<StackedSlot> slot = stacked_slot(name);
        for (const auto& k : folders_.at(slot ? slot->folder : name))
          if (k != "fp32" && k != "step") keys.push_back(k);
        std::stable_sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
          auto rank = [](const std::string& k) { return k == "exp_avg" ? 0 : k == "exp_avg_sq" ? 1 : 2; };
          return rank(a) < rank(b);
        });
        for (const auto& k : keys) {
          std::optional<std::size_t> s = param_tensor(model, name, k, shape, "optim.state." + name + "." + k);
          per_param->entries.emplace_back(Value::str(k), make_tensor_ref(*s));
        }
        state->entries.emplace_back(Value::str(name), per_param);
        trained.push_back(name);
      } else {
        idx = other_tensor(model, name);
        if (!idx) {
          log::warn(dir_ + ": '" + name + "' has no value in this universal checkpoint; left out");
          continue;
        }
        if (is_buffer(name))
          model.tensors[*idx].storage = StorageKind::kBuffer;
        else
          model.tensors[*idx].frozen = true;
      }
      refs[name] = make_tensor_ref(*idx);
    }
    for (const auto& name : names) {
      ValuePtr ref;
      if (auto owner = owner_of(name)) {
        auto it = refs.find(*owner);
        if (it == refs.end())
          fail_data_loss(states_.path + ": shared parameter '" + name + "' names '" + *owner + "', which has no value");
        ref = it->second;
      } else if (auto it = refs.find(name); it != refs.end()) {
        ref = it->second;
      } else {
        continue;
      }
      model_dict->entries.emplace_back(Value::str(name), ref);
    }
    auto optim = Value::dict({{Value::str("state"), state}, {Value::str("param_groups"), param_groups(trained)}});
    model.root = Value::dict({{Value::str("model"), model_dict}, {Value::str("optim"), optim}});
  }

  // The optimizer's param groups: hyper-parameters from optimizer_state.pt,
  // members from param_shapes (one entry per group, or ZeRO-3 sub-groups
  // listed by id), in module order.
  ValuePtr param_groups(const std::vector<std::string>& trained) const {
    const Value& root = zero::as_dict(*optim_.root);
    ValuePtr groups = root.get("param_groups");
    if (!groups) {
      ValuePtr osd = root.get("optimizer_state_dict");
      groups = osd ? zero::as_dict(*osd).get("param_groups") : nullptr;
    }
    if (!groups) fail_data_loss(optim_.path + ": no 'param_groups' entry");
    const auto& seq = groups->as_sequence();
    auto out = Value::list({});
    for (std::size_t g = 0; g < seq.size(); ++g) {
      const Value& group = zero::as_dict(*seq[g]);
      if (!group.is(Kind::kDict))
        fail_data_loss(optim_.path + ": param_groups[" + std::to_string(g) + "] is not a dict");
      std::set<std::string> members;
      if (groups_.size() == seq.size()) {
        members.insert(groups_[g].begin(), groups_[g].end());
      } else if (seq.size() == 1) {
        members.insert(trained.begin(), trained.end());
      } else {
        ValuePtr ids = group.get("params");
        if (!ids) fail_data_loss(optim_.path + ": param_groups[" + std::to_string(g) + "] has no 'params'");
        for (const auto& id : ids->as_sequence()) {
          int64_t sub = id->as_int();
          if (sub < 0 || std::size_t(sub) >= groups_.size())
            fail_data_loss(optim_.path + ": param_groups[" + std::to_string(g) + "] lists sub-group " +
                           std::to_string(sub) + " of " + std::to_string(groups_.size()) + " in param_shapes");
          members.insert(groups_[sub].begin(), groups_[sub].end());
        }
      }
      auto copy = Value::dict();
      for (const auto& [k, v] : group.entries)
        if (!k->is(Kind::kStr) || k->text != "params") copy->entries.emplace_back(k, v);
      auto names = Value::list({});
      for (const auto& n : trained)
        if (members.count(n)) names->items.push_back(Value::str(n));
      copy->entries.emplace_back(Value::str("params"), names);
      out->items.push_back(copy);
    }
    return out;
  }

  std::string dir_;
  ProblemSink* problems_;
  std::string only_;
  Decoded states_, optim_;
  std::vector<Decoded> rank_states_;  // ZeRO-3 per-rank model states, read for frozen fragments
  std::vector<std::unordered_map<std::string, ValuePtr>> fragments_;  // each rank's frozen_param_fragments
  std::vector<std::string> files_;
  std::vector<std::vector<std::string>> groups_;  // param_shapes: names per group or sub-group
  std::map<std::string, Shape> shapes_;
  std::map<std::string, std::size_t> sub_group_;
  std::vector<std::string> frozen_order_;
  std::map<std::string, Shape> frozen_shapes_;
  std::vector<std::string> buffers_;
  std::vector<std::pair<std::string, std::string>> shared_;  // alias -> owner
  std::unordered_map<std::string, std::string> owners_;      // the same, looked up
  std::unordered_set<std::string> buffer_set_;
  ValuePtr module_;
  std::unordered_map<std::string, ValuePtr> module_index_;
  std::optional<std::map<int64_t, ValuePtr>> step_states_;  // optimizer_state_dict.state by sub-group
  std::map<std::string, std::set<std::string>> folders_;    // zero/<fqn>/ -> its file stems
  // MoE, per expert name without its id: the ids param_shapes names, the ids with a folder
  std::optional<std::map<std::string, std::pair<std::set<int>, std::set<int>>>> expert_counts_;
  int expert_parallel_ = 1;                              // the entries of the stacked expert files read
  int slices_of_rank0_ = 0;                              // the states file's mp_world_size, when above 1
  std::optional<TensorParallelLayout> tensor_parallel_;  // record_merge: the parameters not cut plainly on dim 0
};

}  // namespace

bool is_universal_tag(const std::string& dir) { return is_tag(dir); }

bool is_universal_checkpoint(const std::string& dir) {
  if (is_tag(dir)) return true;
  // A root is the checkpoint it reads without --tag. DeepSpeed's engine reads
  // what `latest` names unless load_universal is set, and a job resuming
  // from the root expects that: where there is a `latest`, latest_universal
  // does not make the root a universal checkpoint (`latest` may name a
  // universal tag itself).
  const fs::path root(dir);
  try {
    const bool has_latest = stat_path((root / "latest").string()).exists();
    std::optional<std::string> tag = read_latest_tag(root / (has_latest ? "latest" : "latest_universal"));
    return tag && is_tag(root / *tag);
  } catch (const Error&) {
    return false;
  }
}

CheckpointModel read_universal(const std::string& src, ProblemSink* problems, const std::string& only) {
  return UniversalReader(tag_dir(src), problems, only).read();
}

}  // namespace ckpt::ds_universal
