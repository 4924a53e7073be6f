#include "formats/zero/zero_reader.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "core/checked.h"
#include "core/error.h"
#include "core/linear_regex.h"
#include "core/log.h"
#include "core/paths.h"
#include "formats/latest_file.h"
#include "formats/pyobj.h"
#include "formats/torch_pt/pt_reader.h"
#include "formats/zero/moe_experts.h"
#include "formats/zero/pipeline_layers.h"
#include "formats/zero/stage0.h"
#include "formats/zero/tensor_parallel.h"
#include "formats/zero/zero_files.h"
#include "formats/zero/zero_listing.h"
#include "io/containment.h"
#include "io/storage.h"
#include "model/flat_range.h"
#include "model/tensor_compare.h"
#include "model/tree_walk.h"
#include "pickle/policy.h"

namespace ckpt::zero {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// ---- the checkpoint ----

struct ParamSlot {
  std::string name;
  Shape shape;
  std::size_t group = 0;
  std::size_t local = 0;  // index in its param_shapes group (its alignment padding's)
  int replica = 0;        // an expert group's expert-parallel rank (moe_experts.h); else 0
};

// What one reader (a data-parallel checkpoint, or one pipeline stage)
// gives the model's root: its `model` entries in module order, its
// optimizer's per-parameter state and its param groups.
struct StageParts {
  std::vector<std::pair<ValuePtr, ValuePtr>> model, state;
  std::vector<ValuePtr> param_groups;
};

class ZeroReader {
 public:
  // `rank_base`: the global rank of this reader's data-parallel rank 0 (a
  // pipeline stage's, a tensor-parallel rank's), `rank_stride` the distance
  // between its data-parallel ranks (a tensor-parallel rank's: the degree);
  // chunks and problems name global ranks.
  ZeroReader(TagFiles files, ProblemSink* problems, std::string only, int rank_base = 0, int rank_stride = 1)
      : files_(std::move(files)),
        problems_(problems),
        only_(std::move(only)),
        rank_base_(rank_base),
        rank_stride_(rank_stride) {}

  // Decodes the files and reads the layout they give (param_shapes, stage).
  void load() {
    if (files_.optim.empty()) {  // mp_rank_XX_model_states.pt alone (list_files leaves stage 0 to its reader)
      std::string mp = file_name(files_.model.at(0).path);
      mp.resize(mp.size() - std::string_view("_model_states.pt").size());
      fail(ErrorCode::kNotFound,
           files_.dir + ": no *_" + mp + "_optim_states.pt files (a ZeRO checkpoint has one per rank)");
    }
    for (const auto& f : files_.model) models_.push_back(decode(f.path, global_rank(f.rank), problems_, only_));
    for (const auto& f : files_.optim) optims_.push_back(decode(f.path, global_rank(f.rank), problems_, only_));
    ws_ = int(optims_.size());
    read_layout();
  }

  // The module state dict is the model-states file's `module` (data parallel).
  // MoE: with the experts of the expert files, which `module` leaves out.
  void use_saved_module(const std::vector<ModuleEntry>& experts = {}) {
    const Decoded& m0 = models_[0];
    std::vector<ModuleEntry> module;
    for (const auto& [k, v] : as_dict(*at(*m0.root, "module", m0.path)).entries)
      module.push_back({k->as_str(), &m0, v.get()});
    use_module(with_experts(std::move(module), experts));
  }
  // The module state dict is `module` (a pipeline stage's layer files).
  void use_module(std::vector<ModuleEntry> module) {
    module_ = std::move(module);
    require_params_in_module();
  }

  const std::vector<ParamSlot>& params() const { return params_; }
  const Decoded& model_file() const { return models_[0]; }
  int world_size() const { return ws_; }

  // The source's files and what they say of the run, into model.info/facts.
  void describe(CheckpointModel& model) const {
    for (const auto& f : files_.model) model.info.files.push_back(f.path);
    for (const auto& f : files_.optim) model.info.files.push_back(f.path);
    model.facts["zero_stage"] = bf16_optimizer_ ? "1 (BF16_Optimizer)" : std::to_string(stage_);
    if (ValuePtr v = models_[0].root->get("ds_version"); v && v->is(Kind::kStr)) model.facts["ds_version"] = v->text;
    model.facts["tag"] = file_name(files_.dir);
  }

 private:
  const Value& osd(int r) const { return *at(*optims_[r].root, "optimizer_state_dict", optims_[r].path); }

  void read_layout() {
    const Decoded& m0 = models_[0];
    const Value& o0 = osd(0);
    if (ValuePtr stage = o0.get("zero_stage")) {
      stage_ = int(stage->as_int());
    } else if (o0.get("single_partition_of_fp32_groups") && o0.get("base_optimizer_state")) {
      stage_ = 1;  // BF16_Optimizer: stage-1 layout, fp32 partitions kept padded, no zero_stage key
      bf16_optimizer_ = true;
    } else {
      fail(ErrorCode::kUnimplemented, optims_[0].path +
                                          ": an optimizer layout ckptconv does not know (no zero_stage, "
                                          "no single_partition_of_fp32_groups)");
    }
    if (stage_ < 1 || stage_ > 3) fail_data_loss(optims_[0].path + ": zero_stage " + std::to_string(stage_));
    if ((stage_ == 3) != files_.per_rank_model)
      fail_data_loss(files_.dir + ": ZeRO stage " + std::to_string(stage_) + " with " +
                     (files_.per_rank_model ? "per-rank" : "one") + " model-states file(s)");
    if (ValuePtr pc = o0.get("partition_count")) {
      int64_t count = pc->is(Kind::kInt) ? pc->int_value : 0;
      if (pc->is(Kind::kList))
        for (const auto& c : pc->items) count = std::max(count, c->as_int());
      if (count != ws_)
        fail_data_loss(optims_[0].path + ": partition_count " + std::to_string(count) + " but " + std::to_string(ws_) +
                       " optimizer files (files of two world sizes mixed?)");
    }
    if (ValuePtr dp = m0.root->get("dp_world_size"); dp && dp->is(Kind::kInt) && dp->int_value != ws_)
      fail_data_loss(m0.path + ": dp_world_size " + std::to_string(dp->int_value) + " but " + std::to_string(ws_) +
                     " optimizer files");
    const Value& shapes = *at(*m0.root, "param_shapes", m0.path);
    for (std::size_t g = 0; g < shapes.as_sequence().size(); ++g) {
      const Value& group = *shapes.as_sequence()[g];
      if (!group.is(Kind::kDict)) fail_data_loss(m0.path + ": param_shapes[" + std::to_string(g) + "] is not a dict");
      groups_.emplace_back();
      for (const auto& [k, v] : group.entries) {
        groups_.back().push_back(params_.size());
        params_.push_back({k->as_str(), pyobj::int_sequence(*v, "param shape"), g, groups_.back().size() - 1});
      }
    }
    members_.assign(groups_.size(), {expert_data_parallel_ranks(0, 1, ws_)});
    if (stage_ < 3) expand_expert_groups();
    if (ValuePtr buffers = m0.root->get("buffer_names"); buffers && buffers->is(Kind::kList))
      for (const auto& b : buffers->items) buffer_names_.insert(b->as_str());
    if (ValuePtr frozen = m0.root->get("frozen_param_shapes"); frozen && frozen->is(Kind::kDict))
      for (const auto& [k, v] : frozen->entries) frozen_names_.insert(k->as_str());
    if (ValuePtr shared = m0.root->get("shared_params"); shared && shared->is(Kind::kDict))
      for (const auto& [k, v] : shared->entries) shared_[k->as_str()] = v->as_str();
  }

  // param_shapes names the module's own parameters (DeepSpeed takes both
  // from the one model), each once. Checked before anything is built per
  // parameter: an entry costs a few bytes of pickle but a tensor for the
  // master and each optimizer state, so 100,000 made-up empty entries in a
  // 3.8 MB file had taken 0.8-1.8 GB.
  void require_params_in_module() const {
    const Decoded& m0 = models_[0];
    std::set<std::string_view> in_module, seen;
    for (const ModuleEntry& e : module_) in_module.insert(e.name);
    for (const ParamSlot& p : params_) {
      if (!in_module.count(p.name))
        fail_data_loss(m0.path + ": param_shapes names '" + p.name.substr(0, 200) +
                       "', which is not in module: param_shapes does not describe this model");
      if (!seen.insert(p.name).second)
        fail_data_loss(m0.path + ": param_shapes names '" + p.name.substr(0, 200) + "' twice");
    }
  }

  // MoE (moe_experts.h): a group whose partition_count is a divisor of the
  // world size below it is an expert group, one flat buffer per
  // expert-parallel rank e over ranks e, e+ep, ...; its param_shapes names
  // the local experts, which become every expert-parallel rank's global ones.
  void expand_expert_groups() {
    ValuePtr counts = osd(0).get("partition_count");
    if (!counts || !counts->is(Kind::kList)) return;
    const auto& base_groups = at(base_state(0), "param_groups", optims_[0].path)->as_sequence();
    std::vector<ParamSlot> params;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      int64_t count = g < counts->items.size() ? counts->items[g]->as_int() : ws_;
      std::vector<std::size_t> members;
      if (count == ws_) {
        for (std::size_t i : groups_[g]) members.push_back(params.size()), params.push_back(params_[i]);
        groups_[g] = std::move(members);
        continue;
      }
      const std::string& path = optims_[0].path;
      ValuePtr moe = g < base_groups.size() ? base_groups[g]->get("moe") : nullptr;
      if (count <= 0 || ws_ % count != 0 || !moe || !moe->is(Kind::kBool) || !moe->bool_value)
        fail_data_loss(path + ": partition_count " + std::to_string(count) + " of param group " + std::to_string(g) +
                       " at world size " + std::to_string(ws_) + ", which is not a MoE expert group");
      require_default_expert_topology();
      const int ep = int(ws_ / count);
      std::map<std::string, int> num_local;  // per MoE layer (expert name prefix)
      for (std::size_t i : groups_[g]) {
        std::optional<ExpertName> e = parse_expert_name(params_[i].name);
        if (!e)
          fail(ErrorCode::kUnimplemented, path + ": expert group " + std::to_string(g) + " holds '" +
                                              params_[i].name.substr(0, 200) +
                                              "', which is not named as DeepSpeed's experts (.deepspeed_experts.N.)");
        num_local[e->prefix] = std::max(num_local[e->prefix], e->id + 1);
      }
      for (int r = 0; r < ep; ++r)
        for (std::size_t i : groups_[g]) {
          ParamSlot slot = params_[i];
          ExpertName e = *parse_expert_name(slot.name);
          slot.name = e.with_id(r * num_local[e.prefix] + e.id);
          slot.replica = r;
          members.push_back(params.size());
          params.push_back(std::move(slot));
        }
      groups_[g] = std::move(members);
      members_[g].clear();
      for (int r = 0; r < ep; ++r) members_[g].push_back(expert_data_parallel_ranks(r, ep, ws_));
      expert_parallel_ = std::max(expert_parallel_, ep);
    }
    params_ = std::move(params);
  }

  // DeepSpeed's other expert topology (data before expert parallelism)
  // places the experts on other ranks, which the files do not record.
  void require_default_expert_topology() const {
    const Decoded& m0 = models_[0];
    ValuePtr config = m0.root->get("ds_config");
    ValuePtr flag = config && config->is(Kind::kDict) ? config->get("use_data_before_expert_parallelism") : nullptr;
    if (flag && flag->is(Kind::kBool) && flag->bool_value)
      fail(ErrorCode::kUnimplemented, m0.path +
                                          ": use_data_before_expert_parallelism is set: ckptconv reads "
                                          "MoE experts in DeepSpeed's default expert-then-data rank order only");
  }

 public:
  int expert_parallel() const { return expert_parallel_; }
  int zero_stage() const { return stage_; }
  const std::set<std::string>& buffer_names() const { return buffer_names_; }

 private:
  // The base optimizer's state_dict(): {'state': {i: {...}}, 'param_groups': [...]}.
  const Value& base_state(int r) const {
    const Value& o = osd(r);
    return stage_ == 3 ? *at(o, "optimizer_state_dict", optims_[r].path)
                       : *at(o, "base_optimizer_state", optims_[r].path);
  }
  // The rank's flat fp32 partitions, one per (sub-)group.
  std::vector<const TensorEntry*> fp32_parts(int r) const {
    const Decoded& d = optims_[r];
    const Value& list = *at(osd(r), stage_ == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups", d.path);
    std::vector<const TensorEntry*> out;
    for (const auto& t : list.as_sequence()) out.push_back(&d.tensor(*t, d.path + ": fp32 partition"));
    return out;
  }
  // state[i] of the base optimizer, per (sub-)group i.
  std::vector<const Value*> state_of_groups(int r, std::size_t count) const {
    const Value& state = *at(base_state(r), "state", optims_[r].path);
    std::vector<const Value*> out(count, nullptr);
    for (const auto& [k, v] : state.entries)
      if (k->is(Kind::kInt) && k->int_value >= 0 && std::size_t(k->int_value) < count) out[k->int_value] = v.get();
    return out;
  }

  std::size_t new_tensor(CheckpointModel& model, std::string name, const Shape& shape, DType dtype) {
    TensorEntry t;
    t.name = std::move(name);
    t.shape = shape;
    t.dtype = dtype;
    t.world_size = ws_;
    t.sharding = "ZeRO-" + std::to_string(stage_) + " flat partitions of " + std::to_string(ws_) + " ranks";
    model.tensors.push_back(std::move(t));
    return model.tensors.size() - 1;
  }

  // One tensor gathered from the ranks' flat partitions of one state key
  // (fp32 master, exp_avg, ...): `parts[r][k]` is rank r's partition of
  // (sub-)group k. Returns the tensor index per parameter.
  std::vector<std::size_t> gather(CheckpointModel& model, const std::vector<std::vector<const TensorEntry*>>& parts,
                                  const std::string& prefix, const std::string& suffix) {
    std::vector<std::size_t> out(params_.size());
    DType dtype = parts.at(0).at(0)->dtype;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      out[i] = new_tensor(model, prefix + params_[i].name + suffix, params_[i].shape, dtype);
      const std::size_t holders = members_[params_[i].group][std::size_t(params_[i].replica)].size();
      if (holders != std::size_t(ws_))  // an expert: its expert-data-parallel group's ranks only
        model.tensors[out[i]].sharding = "ZeRO-" + std::to_string(stage_) + " flat partitions of " +
                                         std::to_string(holders) + " expert-data-parallel ranks";
    }
    if (stage_ == 3) {
      // Every parameter: ceil(numel/ws) elements per rank, at one running
      // offset in each rank's concatenated (sub-)group partitions.
      std::vector<uint64_t> group_start;
      uint64_t total = 0;
      for (const auto* t : parts[0]) {
        group_start.push_back(total);
        total += uint64_t(t->shape.at(0));
      }
      uint64_t off = 0;
      for (std::size_t i = 0; i < params_.size(); ++i) {
        uint64_t numel = shape_numel(params_[i].shape), part = (numel + ws_ - 1) / ws_;
        std::size_t k = std::upper_bound(group_start.begin(), group_start.end(), off) - group_start.begin() - 1;
        for (int r = 0; r < ws_; ++r) {
          uint64_t lo = std::min(numel, uint64_t(r) * part), hi = std::min(numel, uint64_t(r + 1) * part);
          if (k >= parts[r].size())
            fail_data_loss(optims_[r].path + ": fewer flat groups than param_shapes needs ('" + params_[i].name + "')");
          add_flat_range(model.tensors[out[i]], *parts[r][k], off - group_start[k], lo, hi - lo, global_rank(r),
                         optims_[r].path + ": '" + params_[i].name + "'");
        }
        off += part;
      }
      return out;
    }
    // ZeRO-1/2: per group, the ranks' partitions are consecutive pieces of
    // P elements of one flat buffer; parameters sit in param_shapes order,
    // each followed by its alignment padding.
    // An expert group has one such buffer per expert-parallel rank, over
    // that rank's expert-data-parallel group (members_).
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      uint64_t p = partition_size(g);
      std::vector<int64_t> pads = alignment_paddings(g);
      for (std::size_t e = 0; e < members_[g].size(); ++e) {
        const std::vector<int>& ranks = members_[g][e];
        const uint64_t w = ranks.size();
        uint64_t off = 0;
        for (std::size_t i : groups_[g]) {
          const ParamSlot& slot = params_[i];
          if (slot.replica != int(e)) continue;
          uint64_t numel = shape_numel(slot.shape);
          for (uint64_t k = 0; k < w; ++k) {
            const int r = ranks[k];
            uint64_t lo = std::max(off, k * p), hi = std::min(off + numel, (k + 1) * p);
            if (lo >= hi) continue;
            if (g >= parts[r].size()) fail_data_loss(optims_[r].path + ": fewer partitions than param groups");
            add_flat_range(model.tensors[out[i]], *parts[r][g], lo - k * p, lo - off, hi - lo, global_rank(r),
                           optims_[r].path + ": '" + slot.name + "'");
          }
          off += numel + uint64_t(slot.local < pads.size() ? pads[slot.local] : 0);
        }
        if (off > p * w)
          fail_data_loss(files_.dir + ": param group " + std::to_string(g) + " needs " + std::to_string(off) +
                         " elements but its " + std::to_string(w) + " partitions hold " + std::to_string(p * w));
      }
    }
    return out;
  }

  // ZeRO-1/2: the partition size of group g (with padding): the size of the
  // padded optimizer state, or the fp32 partition plus this rank's padding.
  uint64_t partition_size(std::size_t g) const {
    const Value& o = osd(0);
    uint64_t pad = 0;
    if (ValuePtr pads = o.get("group_paddings"); pads && g < pads->as_sequence().size())
      pad = uint64_t(pads->as_sequence()[g]->as_int());
    uint64_t fp32 = uint64_t(fp32_parts(0).at(g)->shape.at(0));
    return bf16_optimizer_ ? fp32 : fp32 + pad;
  }

  std::vector<int64_t> alignment_paddings(std::size_t g) const {
    std::vector<int64_t> out;
    if (ValuePtr all = osd(0).get("param_alignment_paddings"); all && g < all->as_sequence().size())
      for (const auto& v : all->as_sequence()[g]->as_sequence()) out.push_back(v->as_int());
    return out;
  }

  uint64_t group_padding(int r, std::size_t g) const {
    ValuePtr pads = osd(r).get("group_paddings");
    return pads && g < pads->as_sequence().size() ? uint64_t(pads->as_sequence()[g]->as_int()) : 0;
  }

  void partition_problem(int r, const std::string& message) {
    report_or_fail(problems_, Problem{ErrorCode::kDataLoss,
                                      optims_[r].path + ": " + message + "; param_shapes (in " + models_[0].path +
                                          ") does not describe these partitions",
                                      optims_[r].path, global_rank(r)});
  }

  // Every element of every rank's flat partitions belongs to one parameter
  // of param_shapes, its alignment padding, or the group's padding at the
  // end, exactly: one shape shortened or one parameter dropped would
  // otherwise shift every later parameter and its optimizer state.
  // ZeRO-1/2 (DeepSpeed's stage_1_and_2.py): group g's flat buffer is the
  // parameters with their alignment paddings, then padding to W equal
  // partitions of P, all of it the last rank's group_paddings[g]; each
  // rank saves its partition without its own padding (BF16_Optimizer: with
  // it). ZeRO-3 (stage3.py): each parameter gives every rank ceil(numel/W)
  // elements of its (sub-)group's partition.
  void check_partitions_cover_params(const std::vector<std::vector<const TensorEntry*>>& fp32) {
    for (int r = 0; r < ws_; ++r)
      if (fp32[r].size() != groups_.size())
        partition_problem(r, std::to_string(fp32[r].size()) + " flat partitions, but param_shapes has " +
                                 std::to_string(groups_.size()) + " groups");
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      uint64_t need = 0;  // of one buffer (an expert group's: each expert-parallel rank's)
      for (std::size_t i : groups_[g]) {
        if (params_[i].replica != 0) continue;
        uint64_t numel = shape_numel(params_[i].shape);
        need += stage_ == 3 ? (numel + ws_ - 1) / ws_ : numel;
      }
      if (stage_ == 3) {
        for (int r = 0; r < ws_; ++r)
          if (g < fp32[r].size() && uint64_t(fp32[r][g]->shape.at(0)) != need)
            partition_problem(r, "flat partition " + std::to_string(g) + " holds " +
                                     std::to_string(fp32[r][g]->shape.at(0)) + " elements, its parameters " +
                                     std::to_string(need));
        continue;
      }
      for (int64_t pad : alignment_paddings(g)) need += uint64_t(pad);
      if (g >= fp32[0].size()) continue;
      const uint64_t p = partition_size(g);
      for (int r = 0; r < ws_; ++r) {
        if (g >= fp32[r].size()) continue;
        uint64_t held = uint64_t(fp32[r][g]->shape.at(0)) + (bf16_optimizer_ ? 0 : group_padding(r, g));
        if (held != p)
          partition_problem(r, "partition " + std::to_string(g) + " holds " + std::to_string(held) +
                                   " elements with its padding, rank 0's " + std::to_string(p));
      }
      for (const std::vector<int>& ranks : members_[g]) {
        const int last = ranks.back();
        const uint64_t w = ranks.size(), tail = group_padding(last, g);
        if (need + tail != p * w)
          partition_problem(last, "param group " + std::to_string(g) + "'s parameters take " + std::to_string(need) +
                                      " elements with their alignment padding and the group's padding " +
                                      std::to_string(tail) + ", but its " + std::to_string(w) + " partitions hold " +
                                      std::to_string(p * w));
      }
    }
  }

  // A trainable parameter's module entry (the low-precision copy; ZeRO-3
  // leaves it empty) has the shape param_shapes gives it.
  void check_module_shape(const ModuleEntry& entry, const ParamSlot& slot) {
    const Decoded& d = *entry.file;
    if (!tensor_ref_index(*entry.value)) return;
    const TensorEntry& t = d.tensor(*entry.value, d.path + ": module '" + slot.name + "'");
    if (shape_numel(t.shape) == 0 || t.shape == slot.shape) return;
    report_or_fail(problems_, Problem{ErrorCode::kDataLoss,
                                      d.path + ": module '" + slot.name + "' has shape " + shape_str(t.shape) +
                                          ", param_shapes says " + shape_str(slot.shape),
                                      d.path, rank_base_, "model." + slot.name});
  }

 public:
  // The fp32 masters, frozen parameters, buffers and optimizer state of
  // this reader's parameters, appended to model.tensors.
  StageParts build(CheckpointModel& model) {
    // fp32 master weights and the per-parameter optimizer state.
    std::vector<std::vector<const TensorEntry*>> fp32(ws_);
    for (int r = 0; r < ws_; ++r) fp32[r] = fp32_parts(r);
    check_partitions_cover_params(fp32);
    std::size_t ngroups = fp32[0].size();
    std::vector<std::size_t> master = gather(model, fp32, "model.", "");

    std::vector<std::vector<const Value*>> states(ws_);
    for (int r = 0; r < ws_; ++r) states[r] = state_of_groups(r, ngroups);
    std::vector<std::string> state_keys;  // flat keys (exp_avg, ...) and scalar ones (step), in file order
    if (states[0][0])
      for (const auto& [k, v] : states[0][0]->entries) state_keys.push_back(k->as_str());
    std::map<std::string, std::vector<std::size_t>> flat_state;
    std::set<std::string> scalar_keys;
    for (const auto& key : state_keys) {
      const TensorEntry& first =
          optims_[0].tensor(*at(*states[0][0], key, optims_[0].path), optims_[0].path + ": " + key);
      if (first.shape.empty()) {
        scalar_keys.insert(key);
        check_same_on_every_rank(states, key);
        continue;
      }
      std::vector<std::vector<const TensorEntry*>> parts(ws_);
      for (int r = 0; r < ws_; ++r)
        for (std::size_t k = 0; k < ngroups; ++k) {
          if (!states[r][k]) fail_data_loss(optims_[r].path + ": no optimizer state for group " + std::to_string(k));
          parts[r].push_back(
              &optims_[r].tensor(*at(*states[r][k], key, optims_[r].path), optims_[r].path + ": " + key));
        }
      flat_state[key] = gather(model, parts, "optim.state.", "." + key);
    }

    // model: the module's entries in order; trainable ones are the fp32 masters.
    const Decoded& m0 = models_[0];
    std::map<std::string, std::size_t> trainable;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      trainable[params_[i].name] = master[i];
      param_index_[params_[i].name] = i;
    }
    std::map<std::string, ValuePtr> refs;
    for (const ModuleEntry& e : module_) {
      const std::string& name = e.name;
      if (shared_.count(name)) continue;  // tied aliases: added below, as their owner
      std::size_t idx;
      if (auto it = trainable.find(name); it != trainable.end()) {
        idx = it->second;
        check_module_shape(e, params_[param_index_.at(name)]);
      } else if (is_frozen(name)) {
        idx = frozen(model, name);
        model.tensors[idx].frozen = true;
      } else {
        // Neither trained nor a buffer: a frozen parameter that ZeRO-1 keeps
        // in `module` (its frozen_param_shapes is None).
        idx = copy_tensor(model, *e.file, *e.value, "model." + name);
        if (buffer_names_.count(name))
          model.tensors[idx].storage = StorageKind::kBuffer;
        else
          model.tensors[idx].frozen = true;
      }
      refs[name] = make_tensor_ref(idx);
    }
    StageParts out;
    for (const ModuleEntry& e : module_) {
      const std::string& name = e.name;
      ValuePtr ref;
      if (auto alias = shared_.find(name); alias != shared_.end()) {
        auto owner = refs.find(alias->second);
        if (owner == refs.end())
          fail_data_loss(m0.path + ": shared parameter '" + name + "' names '" + alias->second +
                         "', which is not in module");
        ref = owner->second;
      } else {
        ref = refs.at(name);
      }
      out.model.emplace_back(Value::str(name), ref);
    }

    // optim: torch's full optimizer state dict, keyed by FQN.
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto per_param = Value::dict();
      std::size_t k = sub_group_of(i);
      for (const auto& key : state_keys) {
        std::size_t idx;
        if (scalar_keys.count(key)) {
          // Per-group scalars (step) go to every parameter of the group, as
          // torch optimizers keep them: one tensor each, never shared.
          const TensorEntry& src =
              optims_[0].tensor(*at(*states[0][k], key, optims_[0].path), optims_[0].path + ": " + key);
          TensorEntry t = src;
          t.name = "optim.state." + params_[i].name + "." + key;
          model.tensors.push_back(std::move(t));
          idx = model.tensors.size() - 1;
        } else {
          idx = flat_state.at(key)[i];
        }
        per_param->entries.emplace_back(Value::str(key), make_tensor_ref(idx));
      }
      out.state.emplace_back(Value::str(params_[i].name), per_param);
    }
    const Value& base_groups = *at(base_state(0), "param_groups", optims_[0].path);
    std::vector<std::vector<std::size_t>> subs = sub_groups_of(base_groups);
    for (std::size_t g = 0; g < subs.size(); ++g) {
      auto group = Value::dict();
      for (const auto& [k, v] : base_groups.as_sequence()[g]->entries) {
        if (k->is(Kind::kStr) && k->text == "params") continue;
        group->entries.emplace_back(k, v);
      }
      // The module's order (the optimizer's own), not the flat buffer's: with
      // round_robin_gradients param_shapes is reordered.
      std::vector<std::size_t> members;
      for (std::size_t sub : subs[g]) members.insert(members.end(), groups_[sub].begin(), groups_[sub].end());
      std::stable_sort(members.begin(), members.end(), [&](std::size_t a, std::size_t b) {
        return module_pos(params_[a].name) < module_pos(params_[b].name);
      });
      auto names = Value::list({});
      for (std::size_t i : members) names->items.push_back(Value::str(params_[i].name));
      group->entries.emplace_back(Value::str("params"), names);
      out.param_groups.push_back(group);
    }
    return out;
  }

 private:
  // A per-group scalar (the optimizer's `step`) is the same on every rank of
  // one checkpoint; a rank file from another tag or run has another. A few
  // bytes per group are read for this, nothing else.
  void check_same_on_every_rank(const std::vector<std::vector<const Value*>>& states, const std::string& key) {
    for (std::size_t k = 0; k < states[0].size(); ++k) {
      auto bytes = [&](int r) -> std::string {
        const Decoded& d = optims_[r];
        if (!states[r][k]) return {};
        ValuePtr ref = as_dict(*states[r][k]).get(key);
        if (!ref || !tensor_ref_index(*ref)) return {};
        const TensorEntry& t = d.tensor(*ref, d.path + ": " + key);
        if (!t.shape.empty() || t.chunks.size() != 1) return {};
        const TensorChunk& c = t.chunks[0];
        std::size_t n = dtype_size(t.dtype);
        return c.storage->read_string(uint64_t(c.storage_offset) * n, n);
      };
      std::string want = bytes(0);
      for (int r = 1; r < ws_; ++r)
        if (std::string got = bytes(r); !want.empty() && !got.empty() && got != want)
          report_or_fail(problems_,
                         Problem{ErrorCode::kDataLoss,
                                 optims_[r].path + ": optimizer '" + key + "' of group " + std::to_string(k) +
                                     " differs from rank 0's (files of two tags or "
                                     "two runs mixed?)",
                                 optims_[r].path, global_rank(r), "optim.state." + key});
    }
  }

  std::size_t module_pos(const std::string& name) {
    if (module_pos_.empty())
      for (std::size_t i = 0; i < module_.size(); ++i) module_pos_.emplace(module_[i].name, i);
    auto it = module_pos_.find(name);
    return it == module_pos_.end() ? module_pos_.size() : it->second;
  }

  // The (sub-)group holding parameter i: its param_shapes group, which is
  // also the key of its base-optimizer state.
  std::size_t sub_group_of(std::size_t i) const { return params_[i].group; }

  // The param_shapes groups each base-optimizer param group holds. ZeRO-3
  // splits a param group holding more than sub_group_size elements (1e9 by
  // default) into sub-groups, each with its own flat partition, param_shapes
  // entry and optimizer state; the base optimizer's param_groups then list
  // their ids as `params`. Otherwise group g is param_shapes group g.
  std::vector<std::vector<std::size_t>> sub_groups_of(const Value& base_groups) const {
    const auto& groups = base_groups.as_sequence();
    std::vector<std::vector<std::size_t>> out(groups.size());
    if (groups.size() == groups_.size()) {
      for (std::size_t g = 0; g < out.size(); ++g) out[g] = {g};
      return out;
    }
    const std::string& path = optims_[0].path;
    if (stage_ != 3)
      fail_data_loss(path + ": " + std::to_string(groups.size()) + " optimizer param groups for " +
                     std::to_string(groups_.size()) + " param_shapes groups");
    std::vector<int> owner(groups_.size(), -1);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      ValuePtr ids = groups[g]->get("params");
      if (!ids) fail_data_loss(path + ": optimizer param group " + std::to_string(g) + " has no 'params'");
      for (const auto& id : ids->as_sequence()) {
        int64_t sub = id->as_int();
        if (sub < 0 || std::size_t(sub) >= groups_.size() || owner[sub] != -1)
          fail_data_loss(path + ": optimizer param group " + std::to_string(g) + " lists sub-group " +
                         std::to_string(sub) + ", which is not one of the " + std::to_string(groups_.size()) +
                         " param_shapes groups or is listed twice");
        owner[sub] = int(g);
        out[g].push_back(std::size_t(sub));
      }
    }
    for (std::size_t sub = 0; sub < owner.size(); ++sub)
      if (owner[sub] == -1)
        fail_data_loss(path + ": sub-group " + std::to_string(sub) + " belongs to no optimizer param group");
    return out;
  }

  // d.root[dict_key][name], through an index built once per (file, dict):
  // a model's thousands of names are found in log time, not by scanning.
  const Value& lookup(const Decoded& d, const std::string& dict_key, const std::string& name) {
    auto& index = indexes_[{&d, dict_key}];
    if (index.empty())
      for (const auto& [k, v] : as_dict(*at(*d.root, dict_key, d.path)).entries)
        if (k->is(Kind::kStr)) index.emplace(k->text, v);
    auto it = index.find(name);
    if (it == index.end()) fail_data_loss(d.path + ": no '" + name + "' in " + dict_key);
    return *it->second;
  }

  bool is_frozen(const std::string& name) const { return frozen_names_.count(name) > 0; }

  // A frozen parameter as saved (low precision): whole in the ZeRO-1/2 model
  // file, ceil(numel/ws) per rank in ZeRO-3's.
  std::size_t frozen(CheckpointModel& model, const std::string& name) {
    const Decoded& m0 = models_[0];
    Shape shape = pyobj::int_sequence(lookup(m0, "frozen_param_shapes", name), "frozen shape");
    if (stage_ != 3) {
      ValuePtr frags = m0.root->get("frozen_param_fragments");
      const char* where = frags && frags->is(Kind::kDict) ? "frozen_param_fragments" : "module";
      return copy_tensor(model, m0, lookup(m0, where, name), "model." + name);
    }
    std::vector<const TensorEntry*> frags;
    std::vector<std::string> paths;
    for (const Decoded& m : models_) {
      frags.push_back(&m.tensor(lookup(m, "frozen_param_fragments", name), m.path));
      paths.push_back(m.path);
    }
    std::size_t idx = new_tensor(model, "model." + name, shape, frags[0]->dtype);
    add_stage3_fragments(model.tensors[idx], frags, paths);
    return idx;
  }

  TagFiles files_;
  ProblemSink* problems_;
  std::string only_;  // --only: client_state entries with unknown globals are dropped
  std::vector<Decoded> models_, optims_;
  int rank_base_ = 0;
  int rank_stride_ = 1;
  int global_rank(int r) const { return rank_base_ + r * rank_stride_; }
  int expert_parallel_ = 1;
  // per group, the ranks holding each of its flat buffers in partition order:
  // {0..ws-1}, or an expert group's expert-data-parallel groups
  std::vector<std::vector<std::vector<int>>> members_;
  std::vector<ModuleEntry> module_;  // the saved module state dict, in order
  int ws_ = 0;
  int stage_ = 0;
  bool bf16_optimizer_ = false;
  std::vector<ParamSlot> params_;                   // param_shapes order, groups concatenated
  std::map<std::string, std::size_t> param_index_;  // name -> index in params_
  std::vector<std::vector<std::size_t>> groups_;    // param indices per group
  std::map<std::string, std::string> shared_;       // alias -> owner
  std::map<std::string, std::size_t> module_pos_;   // module entry -> its position
  std::set<std::string> frozen_names_;              // frozen_param_shapes (ZeRO-2/3)
  std::set<std::string> buffer_names_;              // module buffers (persistent)
  std::map<std::pair<const Decoded*, std::string>, std::map<std::string, ValuePtr>> indexes_;
};

// The root a ZeRO checkpoint reads as, torch's full state dict:
// {"model": {fqn: ...}, "optim": {"state": {fqn: ...}, "param_groups": [...]}}.
ValuePtr assemble_root(StageParts parts) {
  auto model_dict = Value::dict({}, true);
  for (auto& e : parts.model) model_dict->entries.push_back(std::move(e));
  auto state = Value::dict();
  for (auto& e : parts.state) state->entries.push_back(std::move(e));
  auto optim = Value::dict(
      {{Value::str("state"), state}, {Value::str("param_groups"), Value::list(std::move(parts.param_groups))}});
  return Value::dict({{Value::str("model"), model_dict}, {Value::str("optim"), optim}});
}

// The pipeline stages' parts as one, in stage order (stages hold consecutive
// layers, so that is the module's order). Param group g of the stages'
// optimizers is one group: its hyper-parameters are the same on every stage
// (one ds_config), its params every stage's. A tied module's entries
// (tied_modules.KEY.*) are on every stage that uses it, each stage with its
// own master and optimizer state: kept once, the first stage's, after
// checking that every later stage's values are equal (else DataLoss naming
// both stages' files: the copies DeepSpeed keeps in step have drifted, or
// the files are of two runs). `files[s]` names stage s's files.
StageParts concat_stages(const CheckpointModel& model, std::vector<StageParts> stages,
                         const std::vector<std::string>& files, const std::string& dir) {
  StageParts out;
  std::map<std::string, std::pair<std::size_t, ValuePtr>> seen_model, seen_state;  // name -> (stage, value)
  // The tensors under `a` and `b` (a tensor reference, or a dict of them) are equal.
  auto require_equal = [&](const std::string& name, std::size_t sa, const Value& a, std::size_t sb, const Value& b) {
    std::vector<std::pair<std::string, std::pair<const Value*, const Value*>>> pairs;
    if (tensor_ref_index(a)) {
      pairs.push_back({"", {&a, &b}});
    } else {
      for (const auto& [k, v] : as_dict(a).entries) {
        ValuePtr other = as_dict(b).get(k->as_str());
        if (!other)
          fail_data_loss(dir + ": tied parameter '" + name + "' has no optimizer '" + k->as_str() +
                         "' on pipeline stage " + std::to_string(sb) + " (" + files[sb] + ")");
        pairs.push_back({" (optimizer " + k->as_str() + ")", {v.get(), other.get()}});
      }
    }
    for (const auto& [what, ab] : pairs) {
      auto ia = tensor_ref_index(*ab.first), ib = tensor_ref_index(*ab.second);
      if (ia && ib && same_tensor_values(model.tensors.at(*ia), model.tensors.at(*ib))) continue;
      fail_data_loss(dir + ": tied parameter '" + name + "'" + what + " differs between pipeline stage " +
                     std::to_string(sa) + " (" + files[sa] + ") and stage " + std::to_string(sb) + " (" + files[sb] +
                     "): DeepSpeed keeps the tied copies equal, so these files are not of one save");
    }
  };
  auto take = [&](std::vector<std::pair<ValuePtr, ValuePtr>>& into, decltype(seen_model)& seen, std::size_t s,
                  std::pair<ValuePtr, ValuePtr>& e) {
    const std::string name = e.first->as_str();
    auto [it, fresh] = seen.emplace(name, std::make_pair(s, e.second));
    if (fresh) {
      into.push_back(std::move(e));
      return;
    }
    if (!tied_key_of(name))
      fail_data_loss(dir + ": pipeline stages " + std::to_string(it->second.first) + " and " + std::to_string(s) +
                     " both hold '" + name.substr(0, 200) + "', which is no tied module's (tied_modules.KEY)");
    require_equal(name, it->second.first, *it->second.second, s, *e.second);
  };
  for (std::size_t s = 0; s < stages.size(); ++s) {
    StageParts& p = stages[s];
    for (auto& e : p.model) take(out.model, seen_model, s, e);
    for (auto& e : p.state) take(out.state, seen_state, s, e);
    for (std::size_t g = 0; g < p.param_groups.size(); ++g) {
      if (g == out.param_groups.size()) {
        out.param_groups.push_back(p.param_groups[g]);
        continue;
      }
      auto hyper = [](const Value& group) {
        auto copy = Value::dict();
        for (const auto& [k, v] : group.entries)
          if (!(k->is(Kind::kStr) && k->text == "params")) copy->entries.emplace_back(k, v);
        return copy->repr(8, 64);
      };
      if (hyper(*out.param_groups[g]) != hyper(*p.param_groups[g]))
        fail(ErrorCode::kUnimplemented, dir + ": param group " + std::to_string(g) + " of pipeline stage " +
                                            std::to_string(s) +
                                            " has other hyper-parameters than stage 0's; ckptconv merges "
                                            "the stages' groups only where they agree");
      ValuePtr mine = out.param_groups[g]->get("params"), theirs = p.param_groups[g]->get("params");
      std::set<std::string> listed;
      for (const auto& n : mine->items) listed.insert(n->as_str());
      for (const auto& name : theirs->items)
        if (listed.insert(name->as_str()).second) mine->items.push_back(name);  // a tied module's: listed once
    }
  }
  return out;
}

void finish_info(CheckpointModel& model, const ZeroReader& first, ParallelDegrees degrees) {
  model.info.kind = SourceKind::kZero;
  model.info.records_frozen = true;
  first.describe(model);
  std::sort(model.info.files.begin(), model.info.files.end());
  model.info.world_sizes = {degrees.data * degrees.pipeline * degrees.tensor};
  model.info.parallel = degrees;
}

// A data-parallel ZeRO checkpoint (mp_rank_00 only).
// The expert files of every MoE layer, each expert once (num_experts of the
// model-states file says how many each layer has), decoded into `decoded`;
// their entries, named with global expert ids.
std::vector<ModuleEntry> expert_entries(const TagListing& listing, const Decoded& m0, std::deque<Decoded>& decoded,
                                        ProblemSink* problems, const std::string& only) {
  std::vector<int64_t> counts;
  if (ValuePtr n = m0.root->get("num_experts"); n && n->is(Kind::kList))
    for (const auto& c : n->items) counts.push_back(c->as_int());
  int layers = 0;
  for (const auto& [key, path] : listing.expert_files) layers = std::max(layers, key.first + 1);
  if (counts.empty() || int(counts.size()) < layers)
    fail_data_loss(m0.path + ": expert files of " + std::to_string(layers) + " MoE layer(s) but num_experts lists " +
                   std::to_string(counts.size()));
  std::vector<ModuleEntry> out;
  for (std::size_t layer = 0; layer < counts.size(); ++layer)
    for (int64_t e = 0; e < counts[layer]; ++e) {
      auto it = listing.expert_files.find({int(layer), int(e)});
      if (it == listing.expert_files.end())
        fail(ErrorCode::kNotFound, listing.dir + ": the expert file " + expert_file_name(int(layer), int(e)) +
                                       " (expert " + std::to_string(e) + " of " + std::to_string(counts[layer]) +
                                       " of MoE layer " + std::to_string(layer) + ") is missing");
      decoded.push_back(decode(it->second, -1, problems, only, "entries of an expert state dict"));
      for (const auto& [k, v] : as_dict(*decoded.back().root).entries)
        out.push_back({k->as_str(), &decoded.back(), v.get()});
    }
  if (listing.expert_files.rbegin()->first.second >= counts[listing.expert_files.rbegin()->first.first])
    fail_data_loss(listing.expert_files.rbegin()->second + ": more experts than num_experts says (" +
                   std::to_string(counts[listing.expert_files.rbegin()->first.first]) + ")");
  return out;
}

void require_tensor_degree(const Decoded& m, int ranks);
void join_tensor_parallel(CheckpointModel& model, std::vector<StageParts> parts, const Decoded& m0,
                          const std::string& dir, const std::string& prefix);
std::string tensor_parallel_fact(const CheckpointModel& model, int tp);

CheckpointModel read_data_parallel(const TagListing& listing, ProblemSink* problems, const std::string& only) {
  const TagFiles& files = listing.mp_ranks.at(0);
  ZeroReader reader(files, problems, only);
  reader.load();
  require_tensor_degree(reader.model_file(), 1);
  std::deque<Decoded> experts;  // owns what ModuleEntry points into, until the model is built
  if (reader.expert_parallel() > 1 && listing.expert_files.empty())
    fail(ErrorCode::kNotFound, files.dir +
                                   ": the optimizer files hold MoE expert groups but no "
                                   "layer_L_expert_E_mp_rank_00_model_states.pt file is here");
  if (!listing.expert_files.empty() && reader.zero_stage() == 3)
    fail(ErrorCode::kUnimplemented, files.dir +
                                        ": MoE expert files of a ZeRO-3 run: ckptconv reads MoE "
                                        "checkpoints of ZeRO stages 1 and 2 only");
  CheckpointModel model;
  if (!listing.expert_files.empty()) {
    reader.use_saved_module(expert_entries(listing, reader.model_file(), experts, problems, only));
    for (const auto& [key, path] : listing.expert_files) model.info.files.push_back(path);
  } else {
    reader.use_saved_module();
  }
  model.source = files.dir;
  // Megatron-DeepSpeed at tensor-parallel degree 1 records its patterns
  // too: applied as to the one rank of a tensor-parallel run (see
  // join_tensor_parallel). Not for ZeRO-3 or MoE, which ckptconv reads
  // tensor-parallel at no degree (not generated as fixtures).
  const bool patterns = reader.zero_stage() != 3 && listing.expert_files.empty();
  if (patterns)
    join_tensor_parallel(model, {reader.build(model)}, reader.model_file(), files.dir, "mp_rank_");
  else
    model.root = assemble_root(reader.build(model));
  add_training_state(model, reader.model_file());
  prune_unreferenced(model.root, model.tensors);
  finish_info(model, reader, ParallelDegrees{.data = reader.world_size(), .expert = reader.expert_parallel()});
  if (model.info.tensor_parallel) model.facts["tensor_parallel"] = tensor_parallel_fact(model, 1);
  return model;
}

// checkpoint_parallel_dimensions of a stage's model-states file:
// {'pp_degree': S, 'tp_degree': T}; {} when absent.
std::map<std::string, int64_t> parallel_dimensions(const Decoded& m) {
  std::map<std::string, int64_t> out;
  if (ValuePtr dims = m.root->get("checkpoint_parallel_dimensions"); dims && dims->is(Kind::kDict))
    for (const auto& [k, v] : dims->entries)
      if (k->is(Kind::kStr) && v->is(Kind::kInt)) out[k->text] = v->int_value;
  return out;
}

// The tensor-parallel degree `m` records (checkpoint_parallel_dimensions)
// against the `ranks` whose files are here: every file of the last ranks
// gone would otherwise read as a smaller (or data-parallel) checkpoint.
void require_tensor_degree(const Decoded& m, int ranks) {
  std::map<std::string, int64_t> dims = parallel_dimensions(m);
  if (auto tp = dims.find("tp_degree"); tp != dims.end() && tp->second != ranks)
    fail(ErrorCode::kNotFound, m.path + ": tp_degree " + std::to_string(tp->second) + " but the files of " +
                                   std::to_string(ranks) + " tensor-parallel rank(s) are here (mp_rank_" +
                                   (ranks < 10 ? "0" : "") + std::to_string(ranks) + "_model_states.pt missing)");
}

// ---- tensor parallelism (tensor_parallel.h) ----

std::string mp_name(std::size_t t) { return (t < 10 ? "mp_rank_0" : "mp_rank_") + std::to_string(t); }

// The tensor-parallel ranks' parts (parts[t]: rank t's, built into `model`)
// as one, each tensor merged by `rules`: trainable parameters and their
// optimizer state by the rule of the parameter's name (recorded in
// `layout`); frozen parameters and buffers kept once where every rank holds
// the same value, else merged by the same rule; per-group scalars (step) and
// param groups are rank 0's, the scalars checked equal on every rank.
// How a merged tensor was made of `tp` ranks' slices, for inspect's
// per-tensor line: the category universal_checkpoint_info gave it.
std::string merge_note(const TensorParallelRule& rule, std::size_t tp) {
  using Merge = TensorParallelMerge::Kind;
  const std::string ranks = std::to_string(tp) + " tensor-parallel rank" + (tp == 1 ? "" : "s");
  std::string note;
  switch (rule.merge.kind) {
    case Merge::kReplicated: note = "replicated over " + ranks + (rule.averaged ? " (averaged)" : ""); break;
    case Merge::kTwoSubParams: note = "2 sub-parameters joined per half over " + ranks; break;
    case Merge::kCat:
      note =
          (tp == 1 ? "split on dim " : "concatenated on dim ") + std::to_string(rule.merge.cat_dim) + " over " + ranks;
      break;
  }
  return rule.merge.vocabulary ? note + ", vocabulary padding cut" : note;
}

StageParts merge_tensor_parallel(CheckpointModel& model, const std::vector<StageParts>& parts,
                                 const TensorParallelRules& rules, TensorParallelLayout& layout,
                                 const std::string& dir) {
  const std::size_t tp = parts.size();
  // Each rank's entries by name; every rank holds the same names as rank 0.
  auto by_name = [&](const std::vector<std::pair<ValuePtr, ValuePtr>>& entries, std::size_t expected, std::size_t t,
                     const char* what) {
    std::map<std::string, ValuePtr> out;
    for (const auto& [k, v] : entries) out[k->as_str()] = v;
    if (out.size() != expected)
      fail_data_loss(dir + ": " + mp_name(t) + " has " + std::to_string(out.size()) + " " + what + " entries, " +
                     mp_name(0) + " " + std::to_string(expected) + ": not the same model");
    return out;
  };
  std::vector<std::map<std::string, ValuePtr>> modules, states;
  for (std::size_t t = 0; t < tp; ++t) {
    modules.push_back(by_name(parts[t].model, parts[0].model.size(), t, "module"));
    states.push_back(by_name(parts[t].state, parts[0].state.size(), t, "optimizer state"));
  }
  auto slices_of = [&](const std::vector<std::map<std::string, ValuePtr>>& maps, const std::string& name,
                       const std::string& key) {
    std::vector<std::size_t> out;
    for (std::size_t t = 0; t < tp; ++t) {
      auto it = maps[t].find(name);
      if (it == maps[t].end())
        fail_data_loss(dir + ": " + mp_name(t) + " has no '" + name + "' (" + mp_name(0) + " has)");
      ValuePtr v = it->second;
      if (!key.empty()) v = as_dict(*v).get(key);
      auto index = v ? tensor_ref_index(*v) : std::nullopt;
      if (!index) fail_data_loss(dir + ": " + mp_name(t) + "'s '" + name + "' has no tensor " + key);
      out.push_back(*index);
    }
    return out;
  };
  auto merged = [&](const std::vector<std::size_t>& idx, const TensorParallelRule& rule, const std::string& name) {
    std::vector<const TensorEntry*> slices;
    for (std::size_t i : idx) slices.push_back(&model.tensors.at(i));
    TensorEntry t = merge_slices(slices, rule, rules, name);
    t.sharding += ", " + merge_note(rule, tp);
    model.tensors.push_back(std::move(t));
    return make_tensor_ref(model.tensors.size() - 1);
  };
  auto all_equal = [&](const std::vector<std::size_t>& idx) {
    for (std::size_t t = 1; t < idx.size(); ++t)
      if (!same_tensor_values(model.tensors.at(idx[t]), model.tensors.at(idx[0]))) return false;
    return true;
  };
  layout.degree = int(tp);
  StageParts out;
  std::map<std::size_t, ValuePtr> done;  // rank 0's tensor -> its merged reference (tied aliases stay tied)
  for (const auto& [k, v] : parts[0].model) {
    const std::string name = k->as_str();
    std::vector<std::size_t> idx = slices_of(modules, name, "");
    ValuePtr& ref = done[idx[0]];
    if (!ref) {
      TensorParallelRule rule = rules.rule_for(name);
      if (states[0].count(name)) {
        ref = merged(idx, rule, "model." + name);
        layout.params[name] = rule.merge;
      } else {
        ref = all_equal(idx) ? make_tensor_ref(idx[0]) : merged(idx, rule, "model." + name);
      }
    }
    out.model.emplace_back(k, ref);
  }
  for (const auto& [k, v] : parts[0].state) {
    const std::string name = k->as_str();
    const TensorParallelRule rule = rules.rule_for(name);
    auto per_param = Value::dict();
    for (const auto& [key, ref] : as_dict(*v).entries) {
      std::vector<std::size_t> idx = slices_of(states, name, key->as_str());
      if (model.tensors.at(idx[0]).shape.empty()) {  // step
        if (!all_equal(idx))
          fail_data_loss(dir + ": optimizer '" + key->as_str() + "' of '" + name +
                         "' differs between tensor-parallel ranks (files of two tags or runs mixed?)");
        per_param->entries.emplace_back(key, make_tensor_ref(idx[0]));
      } else {
        per_param->entries.emplace_back(key, merged(idx, rule, "optim.state." + name + "." + key->as_str()));
      }
    }
    out.state.emplace_back(k, per_param);
  }
  out.param_groups = parts[0].param_groups;
  return out;
}

// The tensor-parallel ranks' parts (parts[t]: rank t's state dict) as the
// model's root. With universal_checkpoint_info (in `m0`, rank 0's
// model-states file) they are merged into one state dict; without, each is
// its own part under `prefix` + its two-digit rank (`mp_rank_01`: a
// tensor-parallel checkpoint's parts are its mp ranks; a pipeline's span
// several mp ranks each, so they are `tp_rank_01`), never concatenated on a
// guessed dimension. One part alone is the root, with the patterns applied
// where there are some (Megatron-DeepSpeed records them at degree 1 too):
// the vocabulary's padding cut, and a universal checkpoint written from it
// saying how a loader at degree 2 cuts each parameter, as ds_to_universal's
// does (without, a row-parallel weight is cut on dim 0 there, silently).
void join_tensor_parallel(CheckpointModel& model, std::vector<StageParts> parts, const Decoded& m0,
                          const std::string& dir, const std::string& prefix) {
  const std::size_t tp = parts.size();
  ValuePtr info = m0.root->get("universal_checkpoint_info");
  const bool patterns = info && !info->is(Kind::kNone);
  if (tp == 1 && !patterns) {
    model.root = assemble_root(std::move(parts[0]));
    return;
  }
  if (patterns) {
    TensorParallelRules rules(*info, m0.path);
    TensorParallelLayout layout;
    model.root = assemble_root(merge_tensor_parallel(model, parts, rules, layout, dir));
    model.info.tensor_parallel = std::move(layout);
    return;
  }
  log::warn(dir + ": " + std::to_string(tp) + " tensor-parallel ranks, read each as its own part (" + prefix + "00, " +
            prefix + "01, ...: each a state dict of that rank's slices): the model-states files record no " +
            "universal_checkpoint_info saying along which dimension each tensor is split, and ckptconv does not guess");
  model.root = Value::dict();
  for (std::size_t t = 0; t < tp; ++t)
    model.root->entries.emplace_back(Value::str(prefix + (t < 10 ? "0" : "") + std::to_string(t)),
                                     assemble_root(std::move(parts[t])));
}

// inspect's `tensor_parallel` line: which of the two join_tensor_parallel did.
std::string tensor_parallel_fact(const CheckpointModel& model, int tp) {
  if (tp == 1) return "1, universal_checkpoint_info applied (its vocabulary padding cut)";
  return std::to_string(tp) + (model.info.tensor_parallel ? " ranks merged as universal_checkpoint_info says"
                                                          : " ranks, each its own part (no universal_checkpoint_info)");
}

// A tensor-parallel checkpoint (mp_rank_00..T-1 without layer files): one
// ZeroReader per tensor-parallel rank over its data-parallel ranks' files.
// With universal_checkpoint_info the ranks are merged into one state dict;
// without, each is its own part under its mp_rank_XX name, never
// concatenated on a guessed dimension.
CheckpointModel read_tensor_parallel(const TagListing& listing, ProblemSink* problems, const std::string& only) {
  const int tp = int(listing.mp_ranks.size());
  const int dp = int(listing.mp_ranks[0].optim.size());
  std::vector<std::unique_ptr<ZeroReader>> readers;
  for (int t = 0; t < tp; ++t) {
    const TagFiles& files = listing.mp_ranks[t];
    if (int(files.optim.size()) != dp)
      fail_data_loss(listing.dir + ": tensor-parallel rank " + std::to_string(t) + " has " +
                     std::to_string(files.optim.size()) + " optimizer files, rank 0 " + std::to_string(dp) +
                     " (files of two runs mixed?)");
    // Megatron's order: data-parallel rank d of tensor-parallel rank t is global rank d * tp + t
    readers.push_back(std::make_unique<ZeroReader>(files, problems, only, t, tp));
    readers.back()->load();
    require_tensor_degree(readers.back()->model_file(), tp);
    if (readers.back()->zero_stage() == 3)
      fail(ErrorCode::kUnimplemented, listing.dir +
                                          ": ZeRO-3 with tensor parallelism: ckptconv reads tensor-parallel "
                                          "checkpoints of ZeRO stages 1 and 2 (not generated as a fixture)");
    if (readers.back()->expert_parallel() > 1)
      fail(ErrorCode::kUnimplemented, listing.dir + ": MoE expert groups with tensor parallelism are not supported");
    readers.back()->use_saved_module();
  }
  CheckpointModel model;
  model.source = listing.dir;
  std::vector<StageParts> parts;
  for (int t = 0; t < tp; ++t) parts.push_back(readers[t]->build(model));
  const Decoded& m0 = readers[0]->model_file();
  join_tensor_parallel(model, std::move(parts), m0, listing.dir, "mp_rank_");
  add_training_state(model, m0);
  prune_unreferenced(model.root, model.tensors);
  for (int t = 1; t < tp; ++t) readers[t]->describe(model);
  finish_info(model, *readers[0], ParallelDegrees{.data = dp, .tensor = tp});
  model.facts["tensor_parallel"] = tensor_parallel_fact(model, tp);
  return model;
}

// The pipeline stages of tensor-parallel rank t of `tp` (mp ranks s x tp + t;
// tp 1 without a tensor axis): one ZeroReader per stage over its
// data-parallel ranks' files, the module state dict of each stage from its
// layer files `layer_files` (pipeline_layers.h), built into `model` and
// concatenated. `readers` and `decoded` own what the parts point into.
StageParts read_pipeline_stages(CheckpointModel& model, const TagListing& listing,
                                const std::map<int, std::string>& layer_files, int t, int tp, ProblemSink* problems,
                                const std::string& only, std::vector<std::unique_ptr<ZeroReader>>& readers,
                                std::deque<Decoded>& decoded) {
  const bool tensor_axis = !listing.tp_layer_files.empty();
  const int stages = int(listing.mp_ranks.size()) / tp;
  const int dp = int(listing.mp_ranks[0].optim.size());
  const std::size_t first = readers.size();
  std::vector<std::string> stage_files;  // for messages: each stage's optimizer files
  for (int s = 0; s < stages; ++s) {
    const TagFiles& files = listing.mp_ranks[std::size_t(s * tp + t)];
    const std::string mp = mp_name(std::size_t(s * tp + t));
    if (files.per_rank_model)
      fail(ErrorCode::kUnimplemented, listing.dir +
                                          ": ZeRO-3 files beside pipeline layer files (DeepSpeed's "
                                          "pipeline engine allows ZeRO stages 0 and 1 only)");
    if (int(files.optim.size()) != dp)
      fail_data_loss(listing.dir + ": pipeline stage " + std::to_string(s) + " (" + mp + ") has " +
                     std::to_string(files.optim.size()) + " optimizer files, stage 0 " + std::to_string(dp) +
                     " (files of two runs mixed?)");
    // PipeModelDataParallelTopology: data-parallel rank d of stage s at
    // tensor-parallel rank t is global rank (s x dp + d) x tp + t
    readers.push_back(std::make_unique<ZeroReader>(files, problems, only, s * dp * tp + t, tp));
    readers.back()->load();
    stage_files.push_back("*_" + mp + "_optim_states.pt");
    // What the stage's own file says of the topology: a stage or a
    // tensor-parallel rank missing altogether (all its files) shows here.
    const Decoded& m = readers.back()->model_file();
    std::map<std::string, int64_t> dims = parallel_dimensions(m);
    if (auto d = dims.find("tp_degree"); d != dims.end() && d->second != tp)
      fail(ErrorCode::kNotFound, m.path + ": tp_degree " + std::to_string(d->second) + " but the layer files of " +
                                     std::to_string(tp) + " tensor-parallel rank(s) are here" +
                                     (tensor_axis ? " (" + layer_file_name(0, tp) + " and the like missing)"
                                                  : " (layer_LL-model_states.pt, no tensor axis)"));
    if (auto d = dims.find("pp_degree"); d != dims.end() && d->second != stages)
      fail(ErrorCode::kNotFound, m.path + ": pp_degree " + std::to_string(d->second) + " but the files of " +
                                     std::to_string(stages) + " pipeline stage(s) are here (" +
                                     mp_name(std::size_t(stages * tp)) + "_model_states.pt missing)");
  }
  std::vector<std::vector<std::string>> names(stages);
  std::set<std::string> all_names;  // every stage's parameters and buffers: what tied modules hold
  std::set<int> trained_layers;
  for (int s = 0; s < stages; ++s) {
    for (const ParamSlot& p : readers[first + s]->params()) {
      names[s].push_back(p.name);
      all_names.insert(p.name);
      if (std::optional<int> layer = pipeline_layer_of(p.name)) trained_layers.insert(*layer);
    }
    all_names.insert(readers[first + s]->buffer_names().begin(), readers[first + s]->buffer_names().end());
  }
  std::vector<std::vector<int>> layers = stage_layers(names, layer_files, listing.dir, tensor_axis ? t : -1);

  // Each layer file decoded once; one no parameter names may be a tied
  // module's, recognised by its entries (the first such file of each key).
  std::map<int, const Decoded*> file_of;
  std::map<std::string, const Decoded*> tied_file;
  std::set<int> tied_layers;
  for (int s = 0; s < stages; ++s)
    for (int layer : layers[s]) {
      const std::string& path = layer_files.at(layer);
      decoded.push_back(decode(path, s * dp * tp + t, problems, only, "entries of a layer state dict"));
      file_of[layer] = &decoded.back();
      model.info.files.push_back(path);
      if (trained_layers.count(layer)) continue;
      if (std::optional<std::string> key = tied_key_of_layer(layer_file_keys(decoded.back()), all_names, path)) {
        tied_file.emplace(*key, &decoded.back());
        tied_layers.insert(layer);
      }
    }

  std::vector<StageParts> parts;
  for (int s = 0; s < stages; ++s) {
    ZeroReader& reader = *readers[first + s];
    // PipelineModule registers tied_modules ahead of the numbered layers:
    // the stage's tied modules first, in the order its parameters name them.
    std::vector<std::string> keys;
    for (const std::string& n : names[s])
      if (std::optional<std::string> key = tied_key_of(n);
          key && std::find(keys.begin(), keys.end(), *key) == keys.end())
        keys.push_back(*key);
    std::vector<ModuleEntry> module;
    for (const std::string& key : keys) {
      auto it = tied_file.find(key);
      if (it == tied_file.end())
        fail(ErrorCode::kNotFound, listing.dir + ": pipeline stage " + std::to_string(s) + " trains the tied module '" +
                                       key + "' (tied_modules." + key +
                                       ".*) but no layer file holds its entries (DeepSpeed writes one under the "
                                       "index of each layer that calls the module itself)");
      append_layer_entries(module, "tied_modules." + key + ".", *it->second);
    }
    for (int layer : layers[s])
      if (!tied_layers.count(layer)) append_layer_entries(module, std::to_string(layer) + ".", *file_of.at(layer));
    reader.use_module(std::move(module));
    parts.push_back(reader.build(model));
  }
  return concat_stages(model, std::move(parts), stage_files, listing.dir);
}

// A pipeline-parallel checkpoint (pipeline_layers.h), with or without a
// tensor axis: each tensor-parallel rank's stages read as one state dict
// (read_pipeline_stages), the tensor-parallel ranks then joined as
// join_tensor_parallel says.
CheckpointModel read_pipeline(const TagListing& listing, ProblemSink* problems, const std::string& only) {
  const bool tensor_axis = !listing.tp_layer_files.empty();
  const int tp = tensor_axis ? int(listing.tp_layer_files.size()) : 1;
  if (tensor_axis && listing.tp_layer_files.rbegin()->first != tp - 1)
    fail(ErrorCode::kNotFound, listing.dir + ": layer files of tensor-parallel ranks up to " +
                                   std::to_string(listing.tp_layer_files.rbegin()->first) + " but of only " +
                                   std::to_string(tp) + " ranks (layer_LL-model_TT-model_states.pt missing)");
  if (listing.mp_ranks.size() % std::size_t(tp) != 0)
    fail(ErrorCode::kNotFound, listing.dir + ": " + std::to_string(listing.mp_ranks.size()) +
                                   " model-parallel ranks (mp_rank_XX) for " + std::to_string(tp) +
                                   " tensor-parallel ranks: a stage's files are missing");
  const int stages = int(listing.mp_ranks.size()) / tp;
  const int dp = int(listing.mp_ranks[0].optim.size());
  std::vector<std::unique_ptr<ZeroReader>> readers;  // tensor-parallel rank t's stages at t x stages ..
  std::deque<Decoded> layer_files;                   // owns what ModuleEntry points into, until the model is built
  CheckpointModel model;
  model.source = listing.dir;
  std::vector<StageParts> ranks;
  for (int t = 0; t < tp; ++t)
    ranks.push_back(read_pipeline_stages(model, listing,
                                         tensor_axis ? listing.tp_layer_files.at(t) : listing.layer_files, t, tp,
                                         problems, only, readers, layer_files));
  join_tensor_parallel(model, std::move(ranks), readers[0]->model_file(), listing.dir, "tp_rank_");
  add_training_state(model, readers[0]->model_file());
  prune_unreferenced(model.root, model.tensors);
  for (std::size_t i = 1; i < readers.size(); ++i) readers[i]->describe(model);
  finish_info(model, *readers[0], ParallelDegrees{.data = dp, .pipeline = stages, .tensor = tp});
  if (tp > 1 || model.info.tensor_parallel) model.facts["tensor_parallel"] = tensor_parallel_fact(model, tp);
  return model;
}

}  // namespace

CheckpointModel read_zero(const std::string& src, const std::string& tag, const std::string& only,
                          ProblemSink* problems) {
  TagListing listing = list_files(tag_dir(src, tag));
  const bool pipeline = !listing.layer_files.empty() || !listing.tp_layer_files.empty();
  // list_files: no optimizer files on mp_rank_00 means none on any mp rank
  if (listing.mp_ranks[0].optim.empty() && listing.expert_files.empty()) return read_stage0(listing, problems, only);
  if (pipeline) return read_pipeline(listing, problems, only);
  if (listing.mp_ranks.size() > 1) return read_tensor_parallel(listing, problems, only);
  return read_data_parallel(listing, problems, only);
}

}  // namespace ckpt::zero
