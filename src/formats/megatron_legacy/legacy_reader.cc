#include "formats/megatron_legacy/legacy_reader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "formats/megatron_legacy/optim_layout.h"
#include "formats/megatron_legacy/tp_layout.h"
#include "formats/torch_pt/quarantined_pt.h"
#include "io/byte_source.h"
#include "io/storage.h"
#include "model/flat_range.h"
#include "model/tensor_compare.h"
#include "model/tree_walk.h"

namespace ckpt::megatron_legacy {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// The tracker holds a number or "release" and a newline; anything longer is not one.
constexpr uint64_t kMaxTrackerBytes = 64;
// Degrees past these are not a job's: a hostile args would make the reader
// expect millions of rank folders.
constexpr int64_t kMaxDegree = 1 << 16;

// The top-level entries one rank's file holds alike on every rank, given
// once from the first rank's file. `optimizer` and `rng_state` differ per
// rank and are not consolidated (see warn_dropped).
const std::set<std::string>& kJobEntries() {
  static const std::set<std::string> k = {"args",
                                          "checkpoint_version",
                                          "iteration",
                                          "num_floating_point_operations_so_far",
                                          "opt_param_scheduler",
                                          "rerun_state_machine"};
  return k;
}

// One rank's model_optim_rng.pt.
struct RankFile {
  int tp = 0, pp = 0;
  std::string path;
  std::optional<torch_pt::QuarantinedPt> decoded;  // absent: missing or unreadable (validate read on)
};

// The sizes the job ran at, from its args.
struct Degrees {
  int64_t tp = 1, pp = 1, ep = 1, vpp = 0;  // vpp 0: no virtual pipelining
  int64_t num_layers = -1;
  bool swiglu = false;
};

int64_t int_arg(const ValuePtr& args, std::string_view name, int64_t fallback) {
  ValuePtr v = args ? args->get(name) : nullptr;
  return v && v->is(Kind::kInt) ? v->int_value : fallback;
}

// The tensor a model entry's value references in `file`; nullptr for a
// plain value (an _extra_state object, None).
const TensorEntry* tensor_of(const torch_pt::QuarantinedPt& file, const Value& v) {
  auto idx = tensor_ref_index(v);
  return idx ? &file.tensors.at(*idx) : nullptr;
}

// `t`'s one chunk narrowed to rows [from, from + rows) of dim 0, placed at
// global row `at`.
TensorChunk rows_of(const TensorEntry& t, int64_t from, int64_t rows, int64_t at) {
  TensorChunk c = t.chunks.at(0);
  c.storage_offset += from * c.strides[0];
  c.sizes[0] = rows;
  c.offsets[0] = at;
  return c;
}

class LegacyReader {
 public:
  LegacyReader(std::string dir, ProblemSink* sink, std::string only)
      : dir_(std::move(dir)), sink_(sink), only_(std::move(only)) {}

  CheckpointModel read() {
    std::map<std::pair<int, int>, std::string> found = rank_folders();
    // The first folder's args give the degrees every other folder is checked against.
    RankFile first = decode(rank_file_path(found.begin()->second));
    args_ = first.decoded->root->get("args");
    if (args_) args_ = mapping_of(args_);
    degrees_ = degrees_of(first);
    read_all_ranks(found, std::move(first));
    CheckpointModel model;
    model.source = dir_;
    model.info.kind = SourceKind::kMegatronLegacy;
    model.info.world_sizes = {static_cast<int>(degrees_.tp * degrees_.pp)};
    add_facts(model);
    ValuePtr root = Value::dict();
    if (only_ == "optim") {
      root->entries.emplace_back(Value::str("optim"), merged_optim(model));
    } else {
      if (complete_) root->entries.emplace_back(Value::str("model"), merged_model(model));
      if (only_.empty()) add_job_entries(model, root);
    }
    // The files read: every rank file, and the distrib_optim.pt files
    // --only optim of the distributed optimizer reads.
    for (const RankFile& r : ranks_)
      if (r.decoded) model.info.files.push_back(r.path);
    model.info.files.insert(model.info.files.end(), optim_files_.begin(), optim_files_.end());
    std::sort(model.info.files.begin(), model.info.files.end());
    model.root = root;
    prune_unreferenced(model.root, model.tensors);
    return model;
  }

 private:
  // The rank folders by their numbers (tp, second number or 0).
  std::map<std::pair<int, int>, std::string> rank_folders() const {
    std::map<std::pair<int, int>, std::string> out;
    for (const DirEntry& e : list_directory(dir_)) {
      if (!e.is_directory()) continue;
      std::optional<RankFolderName> n = parse_rank_folder(e.name);
      if (!n) continue;
      if (n->third)
        fail(ErrorCode::kUnimplemented, e.path +
                                            ": a rank folder of an expert-parallel job (mp_rank_<tp>_<pp>_<ep>); "
                                            "expert parallelism in legacy checkpoints is not supported yet");
      out[{n->tp, n->second.value_or(0)}] = e.name;
    }
    if (out.empty()) fail(ErrorCode::kNotFound, dir_ + ": no mp_rank_* folders (not a Megatron-LM legacy checkpoint)");
    return out;
  }

  std::string rank_file_path(const std::string& folder) const { return (fs::path(dir_) / folder / kRankFile).string(); }

  // The rank file at `path` decoded (its TP and PP rank set by the caller).
  RankFile decode(const std::string& path) {
    RankFile r;
    r.path = path;
    // The optimizer and RNG states are not consolidated: with --only model,
    // a job's own class in them is skipped with a warning.
    auto uses = [this](const std::string& key) {
      return only_.empty() || key == "args" || key.rfind("model", 0) == 0 || (only_ == "optim" && key == "optimizer");
    };
    r.decoded = torch_pt::decode_quarantined(r.path, -1, sink_, only_, uses,
                                             "the training job's own state in a Megatron-LM rank file",
                                             "a Megatron-LM rank file (a dict with args and model)");
    return r;
  }

  Degrees degrees_of(const RankFile& first) const {
    if (!args_ || !args_->is(Kind::kDict))
      fail_data_loss(first.path + ": no `args` (an argparse.Namespace), which Megatron-LM saves in every rank file");
    Degrees d;
    d.tp = int_arg(args_, "tensor_model_parallel_size", 1);
    d.pp = int_arg(args_, "pipeline_model_parallel_size", 1);
    d.ep = int_arg(args_, "expert_model_parallel_size", 1);
    d.vpp = int_arg(args_, "virtual_pipeline_model_parallel_size", 0);
    d.num_layers = int_arg(args_, "num_layers", -1);
    ValuePtr swiglu = args_->get("swiglu");
    d.swiglu = swiglu && swiglu->is(Kind::kBool) && swiglu->as_bool();
    for (auto [name, v] : {std::pair{"tensor_model_parallel_size", d.tp},
                           {"pipeline_model_parallel_size", d.pp},
                           {"expert_model_parallel_size", d.ep}})
      if (v < 1 || v > kMaxDegree)
        fail_data_loss(first.path + ": args." + name + " = " + std::to_string(v) + ", not a parallel degree");
    if (d.ep > 1 || int_arg(args_, "num_experts", 0) > 0)
      fail(ErrorCode::kUnimplemented, first.path +
                                          ": a mixture-of-experts job (args.num_experts, expert_model_"
                                          "parallel_size); its legacy checkpoints are not supported yet");
    return d;
  }

  // Every rank folder the degrees call for is read; one missing, or
  // unreadable, is an error naming it (under validate: a problem each,
  // and no model is built from the rest).
  void read_all_ranks(const std::map<std::pair<int, int>, std::string>& found, RankFile first) {
    for (const auto& [at, name] : found)
      if (at.first >= degrees_.tp || at.second >= degrees_.pp)
        report(dir_ + "/" + name + ": a rank folder outside the job's TP " + std::to_string(degrees_.tp) + " x PP " +
                   std::to_string(degrees_.pp) + " (args of " + first.path + ")",
               dir_ + "/" + name);
    for (int pp = 0; pp < degrees_.pp; ++pp)
      for (int tp = 0; tp < degrees_.tp; ++tp) {
        std::string name = rank_folder_name(tp, pp, 0, static_cast<int>(degrees_.pp), 1);
        std::string path = rank_file_path(name);
        if (found.count({tp, degrees_.pp > 1 ? pp : 0}) == 0 || !is_regular_file(path)) {
          report(path + ": missing (TP rank " + std::to_string(tp) + ", PP rank " + std::to_string(pp) + " of TP " +
                     std::to_string(degrees_.tp) + " x PP " + std::to_string(degrees_.pp) +
                     "); every model-parallel rank's file is needed",
                 path, ErrorCode::kNotFound);
          ranks_.push_back({tp, pp, path, std::nullopt});
          continue;
        }
        if (first.decoded && first.path == path) {
          first.tp = tp;
          first.pp = pp;
          ranks_.push_back(std::move(first));
          first.decoded.reset();
          continue;
        }
        RankFile r{tp, pp, path, std::nullopt};
        run_reporting(sink_, path, -1, "", [&] { r.decoded = decode(path).decoded; });
        if (!r.decoded) complete_ = false;
        ranks_.push_back(std::move(r));
      }
    check_iterations();
  }

  void report(const std::string& message, const std::string& file, ErrorCode code = ErrorCode::kDataLoss) {
    complete_ = false;
    report_or_fail(sink_, Problem{code, message, file});
  }

  const RankFile& rank(int tp, int pp) const { return ranks_.at(static_cast<std::size_t>(pp * degrees_.tp + tp)); }

  // Every rank saved the same iteration (a folder mixing two saves is not one checkpoint).
  void check_iterations() {
    const RankFile* ref = nullptr;
    for (const RankFile& r : ranks_) {
      if (!r.decoded) continue;
      ValuePtr it = r.decoded->root->get("iteration");
      int64_t n = it && it->is(Kind::kInt) ? it->int_value : -1;
      if (!ref) {
        ref = &r;
        iteration_ = n;
      } else if (n != iteration_) {
        report(r.path + ": iteration " + std::to_string(n) + ", but " + ref->path + " holds iteration " +
                   std::to_string(iteration_) + "; not one save",
               r.path);
      }
    }
  }

  // The model dict of one rank for virtual stage `v`: `model`, or `model<v>`.
  ValuePtr model_dict(const RankFile& r, int64_t v) const {
    std::string key = degrees_.vpp > 1 ? "model" + std::to_string(v) : "model";
    ValuePtr m = r.decoded->root->get(key);
    if (!m) fail_data_loss(r.path + ": no '" + key + "' entry");
    m = mapping_of(m);
    if (!m->is(Kind::kDict)) fail_data_loss(r.path + ": '" + key + "' is not a state dict");
    return m;
  }

  // The model at TP=1/PP=1. Stages in the order their layers have in the
  // model: virtual stage v of pipeline rank p holds the (v * PP + p)-th run
  // of layers, so each stage's layers start where the earlier stages' end,
  // whatever the split (even or not: args.decoder_first_pipeline_num_layers
  // and the like); the total is checked against args.num_layers.
  ValuePtr merged_model(CheckpointModel& model) {
    ValuePtr out = Value::dict();
    int64_t offset = 0;
    const int64_t chunks = std::max<int64_t>(degrees_.vpp, 1);
    for (int64_t v = 0; v < chunks; ++v)
      for (int pp = 0; pp < degrees_.pp; ++pp) {
        std::vector<ValuePtr> dicts;
        for (int tp = 0; tp < degrees_.tp; ++tp) dicts.push_back(model_dict(rank(tp, pp), v));
        offset += merge_stage(model, out, dicts, pp, offset);
      }
    if (degrees_.num_layers >= 0 && offset != degrees_.num_layers)
      fail_data_loss(dir_ + ": the rank files hold " + std::to_string(offset) +
                     " transformer layers, args.num_layers " + "says " + std::to_string(degrees_.num_layers));
    return out;
  }

  // One (virtual) stage's entries, its TP ranks' `dicts` (a model dict,
  // or one optimizer state per parameter name), merged into `out`; returns
  // how many layers it holds.
  int64_t merge_stage(CheckpointModel& model, ValuePtr& out, const std::vector<ValuePtr>& dicts, int pp,
                      int64_t offset) {
    std::set<int64_t> layers;
    for (const auto& [k, val] : dicts[0]->entries)
      if (auto at = layer_index_in(path_component(*k))) layers.insert(at->index);
    const int64_t n = static_cast<int64_t>(layers.size());
    if (n > 0 && *layers.rbegin() != n - 1)
      fail_data_loss(rank(0, pp).path + ": layers " + std::to_string(*layers.begin()) + ".." +
                     std::to_string(*layers.rbegin()) + " but only " + std::to_string(n) +
                     " of them; a stage numbers its layers from 0");
    for (int tp = 1; tp < degrees_.tp; ++tp)
      if (dicts[static_cast<std::size_t>(tp)]->entries.size() != dicts[0]->entries.size())
        fail_data_loss(rank(tp, pp).path + ": " + std::to_string(dicts[static_cast<std::size_t>(tp)]->entries.size()) +
                       " model entries, " + rank(0, pp).path + " " + std::to_string(dicts[0]->entries.size()) +
                       "; TP ranks of one stage hold the same entries");
    for (const auto& [k, val] : dicts[0]->entries) {
      const std::string key = path_component(*k);
      std::string name = key;
      if (auto at = layer_index_in(key)) name.replace(at->pos, at->len, std::to_string(at->index + offset));
      std::vector<ValuePtr> pieces;
      for (int tp = 0; tp < degrees_.tp; ++tp) {
        ValuePtr p = dicts[static_cast<std::size_t>(tp)]->get(key);
        if (!p)
          fail_data_loss(rank(tp, pp).path + ": no model entry '" + key + "', which " + rank(0, pp).path + " has");
        pieces.push_back(p);
      }
      out->entries.emplace_back(Value::str(name),
                                with_context(name, [&] { return merge_entry(model, pp, name, pieces); }));
    }
    return n;
  }

  // One entry of the TP=1 model from its TP pieces.
  ValuePtr merge_entry(CheckpointModel& model, int pp, const std::string& name, const std::vector<ValuePtr>& pieces) {
    const TensorEntry* t0 = tensor_of(*rank(0, pp).decoded, *pieces[0]);
    if (!t0) return pieces[0];  // an _extra_state object (None for the local spec): TP rank 0's, as for torch_dist
    std::vector<const TensorEntry*> ts;
    for (int tp = 0; tp < degrees_.tp; ++tp) {
      const TensorEntry* t = tensor_of(*rank(tp, pp).decoded, *pieces[static_cast<std::size_t>(tp)]);
      if (!t || t->dtype != t0->dtype || t->shape.size() != t0->shape.size())
        fail_data_loss(rank(tp, pp).path + ": '" + name + "' is not a tensor of the dtype and rank " +
                       rank(0, pp).path + " holds");
      ts.push_back(t);
    }
    TensorEntry out = *t0;
    out.name = name;
    if (degrees_.tp > 1) {
      std::optional<TpSplit> split = tp_split_of(name, degrees_.swiglu);
      if (!split)
        fail(ErrorCode::kUnimplemented,
             rank(0, pp).path + ": '" + name +
                 "' is a parameter whose tensor-parallel layout ckptconv does not know (it knows megatron-core's "
                 "embedding, linear_qkv, linear_proj, linear_fc1, linear_fc2, output_layer and layer norms); "
                 "refusing to guess how its TP pieces join");
      out = merge_tp(pp, name, ts, *split);
    }
    model.tensors.push_back(std::move(out));
    return make_tensor_ref(model.tensors.size() - 1);
  }

  TensorEntry merge_tp(int pp, const std::string& name, const std::vector<const TensorEntry*>& ts, TpSplit split) {
    TensorEntry out = *ts[0];
    out.name = name;
    if (split == TpSplit::kWhole || split == TpSplit::kExtraState) {
      check_whole_equal(pp, name, ts);
      return out;
    }
    const std::size_t dim = split == TpSplit::kDim1 ? 1 : 0;
    if (out.shape.size() <= dim)
      fail_data_loss(rank(0, pp).path + ": '" + name + "' of shape " + shape_str(out.shape) + " has no dim " +
                     std::to_string(dim) + " to join its TP pieces on (" + tp_split_name(split) + ")");
    for (std::size_t r = 0; r < ts.size(); ++r)
      for (std::size_t d = 0; d < out.shape.size(); ++d)
        if (d != dim && ts[r]->shape[d] != out.shape[d])
          fail_data_loss(rank(static_cast<int>(r), pp).path + ": '" + name + "' has shape " + shape_str(ts[r]->shape) +
                         ", TP rank 0's " + shape_str(out.shape) + "; its TP pieces differ beyond dim " +
                         std::to_string(dim));
    out.chunks.clear();
    int64_t total = 0;
    for (const TensorEntry* t : ts) total += t->shape[dim];
    out.shape[dim] = total;
    int64_t at = 0;
    for (std::size_t r = 0; r < ts.size(); ++r) {
      const TensorEntry& t = *ts[r];
      if (t.chunks.size() != 1) fail(ErrorCode::kInternal, t.name + ": a torch.save tensor of several chunks");
      if (split == TpSplit::kGatedDim0) {
        // [gate_r; up_r] -> gate_r at the gate rows, up_r at the up rows (total / 2 on).
        if (t.shape[0] % 2)
          fail_data_loss(rank(static_cast<int>(r), pp).path + ": '" + name + "' has " + std::to_string(t.shape[0]) +
                         " rows; a SwiGLU linear_fc1 piece holds [gate; up], an even number");
        const int64_t half = t.shape[0] / 2;
        out.chunks.push_back(rows_of(t, 0, half, at / 2));
        out.chunks.push_back(rows_of(t, half, half, total / 2 + at / 2));
      } else {
        TensorChunk c = t.chunks[0];
        c.offsets[dim] = at;
        out.chunks.push_back(std::move(c));
      }
      at += t.shape[dim];
    }
    return out;
  }

  // Tensors every TP rank holds whole must be equal: a difference means the
  // ranks' files are not of one step, or one is damaged.
  // Compared block by block of rows (same_tensor_values), so a large one
  // (an untied position embedding) costs two blocks of memory, not itself.
  void check_whole_equal(int pp, const std::string& name, const std::vector<const TensorEntry*>& ts) {
    for (std::size_t r = 1; r < ts.size(); ++r) {
      const std::string& where = rank(static_cast<int>(r), pp).path;
      if (ts[r]->shape != ts[0]->shape)
        fail_data_loss(where + ": '" + name + "' has shape " + shape_str(ts[r]->shape) + ", TP rank 0's " +
                       shape_str(ts[0]->shape) + "; every TP rank holds it whole");
      if (!with_context(where, [&] { return same_tensor_values(*ts[r], *ts[0]); }))
        fail_data_loss(where + ": '" + name + "' differs from TP rank 0's (" + rank(0, pp).path +
                       "); every TP rank holds it whole and equal");
    }
  }

  void add_facts(CheckpointModel& model) const {
    std::string degrees = "TP " + std::to_string(degrees_.tp) + " x PP " + std::to_string(degrees_.pp);
    if (degrees_.vpp > 1) degrees += " (virtual pipeline " + std::to_string(degrees_.vpp) + ")";
    degrees += ", EP " + std::to_string(degrees_.ep);
    int64_t dp = int_arg(args_, "data_parallel_size", -1);
    if (dp > 0) degrees += ", DP " + std::to_string(dp);
    model.facts["megatron parallelism"] = degrees;
    model.facts["megatron iteration"] = fs::path(dir_).filename() == "release" ? "release" : std::to_string(iteration_);
    if (!ranks_.empty() && ranks_[0].decoded)
      if (ValuePtr v = ranks_[0].decoded->root->get("checkpoint_version"))
        model.facts["megatron checkpoint_version"] = v->repr();
    std::string key_args;
    for (const char* a : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                          "swiglu", "padded_vocab_size", "params_dtype", "ckpt_format", "use_distributed_optimizer"})
      if (ValuePtr v = args_ ? args_->get(a) : nullptr)
        key_args += (key_args.empty() ? "" : ", ") + (a + ("=" + v->repr()));
    model.facts["megatron args"] = key_args;
    if (!ranks_.empty() && ranks_[0].decoded && only_ != "model")
      model.facts["megatron optimizer"] = optimizer_kind(ranks_[0]);
  }

  // What kind of optimizer state the job saved, from TP 0 / PP 0's file:
  // what --only optim reads, and what --layout megatron-legacy writes.
  std::string optimizer_kind(const RankFile& r) const {
    ValuePtr opt = r.decoded->root->get("optimizer");
    if (!opt) return "not saved";
    if (bool_arg("use_distributed_optimizer")) return "distributed (distrib_optim.pt)";
    opt = mapping_of(opt);
    if (opt->is(Kind::kDict) && opt->get("fp32_from_fp16_params")) return "plain, mixed precision";
    return "plain";
  }

  // Without --only: the job's entries from TP 0 / PP 0's file beside the
  // merged model; the per-rank optimizer and RNG states are left out, saying so.
  void add_job_entries(CheckpointModel& model, ValuePtr& root) {
    const RankFile& r = ranks_.at(0);
    if (!r.decoded) return;
    CheckpointModel part;
    part.root = Value::dict();
    std::vector<std::string> dropped;
    for (const auto& [k, v] : r.decoded->root->entries) {
      std::string key = path_component(*k);
      if (kJobEntries().count(key))
        part.root->entries.emplace_back(k, v);
      else if (key.rfind("model", 0) != 0)
        dropped.push_back(key);
    }
    part.tensors = r.decoded->tensors;
    ValuePtr adopted = adopt(model, std::move(part));
    for (const auto& e : adopted->entries) root->entries.push_back(e);
    if (!dropped.empty()) {
      std::string names;
      for (const auto& d : dropped) names += (names.empty() ? "" : ", ") + d;
      log::warn(dir_ + ": " + names +
                " differ per rank and are not in the model view read here (the model, args, iteration and the "
                "job's counters are; --only optim reads the optimizer by parameter name)");
    }
  }

  // ---- --only optim ----

  // {"state": {name: {state: tensor}}, "param_groups": [...]}, the shape
  // --only optim gives for torch_dist checkpoints, under the names --only
  // model gives: each state a parameter-shaped tensor per rank (a range of
  // distrib_optim.pt's flat buffers, or the plain optimizer's own tensor),
  // merged over TP and PP exactly as the parameter is.
  ValuePtr merged_optim(CheckpointModel& model) {
    if (!complete_) return Value::dict();  // validate reads on; nothing is built from part of the ranks
    const bool distributed = bool_arg("use_distributed_optimizer");
    // `param`: the fp32 master, which the distributed optimizer and the
    // mixed-precision one keep; a plain fp32 optimizer's is the weight itself.
    const std::vector<std::string> kinds = distributed || mixed_precision_plain()
                                               ? std::vector<std::string>{"param", "exp_avg", "exp_avg_sq"}
                                               : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
    // (tp, pp) -> chunk -> kind -> {name: tensor}
    std::map<std::pair<int, int>, std::vector<std::map<std::string, ValuePtr>>> per_rank;
    for (RankFile& r : ranks_)
      per_rank[{r.tp, r.pp}] =
          with_context(r.path, [&] { return distributed ? distopt_state(r, kinds) : plain_state(r, kinds); });
    const int64_t chunks = std::max<int64_t>(degrees_.vpp, 1);
    std::map<std::string, ValuePtr> merged;
    for (const std::string& kind : kinds) {
      ValuePtr out = Value::dict();
      int64_t offset = 0;
      for (int64_t v = 0; v < chunks; ++v)
        for (int pp = 0; pp < degrees_.pp; ++pp) {
          std::vector<ValuePtr> dicts;
          for (int tp = 0; tp < degrees_.tp; ++tp)
            dicts.push_back(per_rank.at({tp, pp}).at(static_cast<std::size_t>(v)).at(kind));
          offset += merge_stage(model, out, dicts, pp, offset);
        }
      merged[kind] = out;
    }
    // Every state's merge went over the same names in the same order.
    ValuePtr state = Value::dict();
    const auto& names = merged.at(kinds[0])->entries;
    for (std::size_t i = 0; i < names.size(); ++i) {
      ValuePtr per = Value::dict();
      for (const std::string& kind : kinds) {
        const auto& [k, v] = merged.at(kind)->entries.at(i);
        if (k->as_str() != names[i].first->as_str())
          fail(ErrorCode::kInternal, names[i].first->as_str() + ": the optimizer's states merged in different orders");
        per->entries.emplace_back(Value::str(kind), v);
      }
      state->entries.emplace_back(names[i].first, per);
    }
    return Value::dict({{Value::str("state"), state}, {Value::str("param_groups"), param_groups(model)}});
  }

  bool bool_arg(std::string_view name) const {
    ValuePtr v = args_ ? args_->get(name) : nullptr;
    return v && v->is(Kind::kBool) && v->as_bool();
  }

  // Refuses (exit 3) a job whose args select layout rules other than those
  // optim_layout.h has, naming the arg.
  void refuse_arg(const RankFile& r, std::string_view name, std::string_view why) const {
    fail(ErrorCode::kUnimplemented, r.path + ": args." + std::string(name) + " = " +
                                        (args_->get(name) ? args_->get(name)->repr() : "?") + ": " + std::string(why) +
                                        "; --only optim does not guess it");
  }

  // The parameters of chunk `v` of rank `r`: the tensors of its model dict
  // in order (the module's registration order; _extra_state objects are
  // not parameters).
  std::vector<LocalParam> chunk_params(const RankFile& r, int64_t v) const {
    std::vector<LocalParam> out;
    for (const auto& [k, val] : model_dict(r, v)->entries)
      if (const TensorEntry* t = tensor_of(*r.decoded, *val)) out.push_back({path_component(*k), t->shape, t->dtype});
    return out;
  }

  // A tensor reference into `r`'s tensors for `t` (added to them).
  ValuePtr add_rank_tensor(RankFile& r, TensorEntry t) {
    r.decoded->tensors.push_back(std::move(t));
    return make_tensor_ref(r.decoded->tensors.size() - 1);
  }

  // The distributed optimizer's state of rank `r` (its distrib_optim.pt),
  // per chunk and state, each parameter's range of the flat buffers.
  std::vector<std::map<std::string, ValuePtr>> distopt_state(RankFile& r, const std::vector<std::string>& kinds) {
    if (int_arg(args_, "mtp_num_layers", 0) > 0)
      refuse_arg(r, "mtp_num_layers", "multi-token prediction keeps another copy of the embeddings");
    if (int_arg(args_, "num_distributed_optimizer_instances", 1) != 1)
      refuse_arg(r, "num_distributed_optimizer_instances", "a partial distributed optimizer");
    const std::string path = (fs::path(r.path).parent_path() / kDistribOptimFile).string();
    if (!is_regular_file(path))
      fail(ErrorCode::kNotFound,
           path + ": missing; args.use_distributed_optimizer says the optimizer's state is there");
    optim_files_.push_back(path);
    torch_pt::QuarantinedPt f = torch_pt::decode_quarantined(
        path, -1, sink_, "", [](const std::string&) { return true; }, "the distributed optimizer's state",
        "a DistributedOptimizer parameter state (distrib_optim.pt)");
    ValuePtr coalesced = f.root->get("buckets_coalesced");
    if (!coalesced || !coalesced->is(Kind::kBool) || !coalesced->as_bool())
      fail(ErrorCode::kUnimplemented,
           path +
               ": no 'buckets_coalesced': True, so not the layout megatron-core 0.16 writes (one flat buffer per "
               "grad buffer; older versions wrote a list per bucket); ckptconv knows 0.16's rules only and "
               "does not guess another's");
    const int64_t chunks = std::max<int64_t>(degrees_.vpp, 1);
    std::vector<std::vector<LocalParam>> params;
    for (int64_t v = 0; v < chunks; ++v) params.push_back(chunk_params(r, v));
    const std::vector<FlatBuffer> buffers =
        distopt_rank_buffers_v016(params, distopt_args_v016(*args_), r.pp, static_cast<int>(degrees_.pp));
    std::size_t stored = 0;
    for (const auto& [k, val] : f.root->entries) stored += k->is(Kind::kInt) ? 1 : 0;
    if (stored != buffers.size())
      fail(ErrorCode::kUnimplemented, path + ": " + std::to_string(stored) +
                                          " grad buffers; megatron-core 0.16's rules for this rank's model (" +
                                          std::to_string(chunks) + " chunk(s), one buffer per parameter dtype) give " +
                                          std::to_string(buffers.size()) + ": not a layout ckptconv knows");
    std::vector<std::map<std::string, ValuePtr>> out(static_cast<std::size_t>(chunks));
    for (std::size_t v = 0; v < out.size(); ++v)
      for (const std::string& kind : kinds) out[v][kind] = Value::dict();
    // Per chunk, name -> kind -> tensor, then given in the chunk's parameter order.
    std::vector<std::map<std::string, std::map<std::string, ValuePtr>>> found(out.size());
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      const FlatBuffer& b = buffers[i];
      const std::string what = path + ": grad buffer " + std::to_string(i);
      ValuePtr by_dtype;
      for (const auto& [k, val] : f.root->entries)
        if (k->is(Kind::kInt) && k->int_value == static_cast<int64_t>(i)) by_dtype = mapping_of(val);
      if (!by_dtype || !by_dtype->is(Kind::kDict) || by_dtype->entries.size() != 1)
        fail_data_loss(what + ": not a dict of one (param dtype, grad dtype) entry");
      const auto& [dkey, st] = by_dtype->entries[0];
      const std::string want =
          "(torch." + std::string(dtype_name(b.param_dtype)) + ", torch." + std::string(dtype_name(b.grad_dtype)) + ")";
      if (dkey->repr() != want)
        fail(ErrorCode::kUnimplemented, what + " is " + dkey->repr() + "; megatron-core 0.16's rules give " + want +
                                            " for chunk " + std::to_string(b.chunk) + "'s parameters");
      ValuePtr numel = mapping_of(st)->get("numel_unpadded");
      const int64_t n = numel && numel->is(Kind::kInt) ? numel->int_value : -1;
      if (n != static_cast<int64_t>(b.numel_unpadded))
        fail(ErrorCode::kUnimplemented,
             what + " holds " + std::to_string(n) +
                 " elements (numel_unpadded); megatron-core 0.16's layout of chunk " + std::to_string(b.chunk) +
                 "'s parameters (reverse order, each at a multiple of 64 elements within its bucket, buckets "
                 "as args set them) gives " +
                 std::to_string(b.numel_unpadded) +
                 ": written under other layout rules (another megatron-core version, frozen parameters), which "
                 "ckptconv does not guess");
      for (const std::string& kind : kinds) {
        const TensorEntry& world = f.tensor(*mapping_of(st)->at(kind), what + " '" + kind + "'");
        if (world.shape != Shape{n} || world.dtype != DType::kFloat32)
          fail_data_loss(what + " '" + kind + "' is " + std::string(dtype_name(world.dtype)) + " " +
                         shape_str(world.shape) + ", not float32 (" + std::to_string(n) + ",)");
        for (const FlatBuffer::Place& place : b.places) {
          const LocalParam& p = params[b.chunk][place.param];
          TensorEntry t;
          t.name = p.name;
          t.dtype = DType::kFloat32;
          t.shape = p.shape;
          add_flat_range(t, world, place.start, 0, p.numel(), -1, what + " '" + kind + "' of " + p.name);
          found[b.chunk][p.name][kind] = add_rank_tensor(r, std::move(t));
        }
      }
    }
    for (std::size_t v = 0; v < out.size(); ++v)
      for (const LocalParam& p : params[v])
        for (const std::string& kind : kinds)
          out[v][kind]->entries.emplace_back(Value::str(p.name), found[v].at(p.name).at(kind));
    return out;
  }

  // The plain optimizer's `optimizer` entry of rank `r`, a dict.
  ValuePtr plain_optimizer(const RankFile& r) const {
    ValuePtr opt = r.decoded->root->get("optimizer");
    if (!opt) fail_data_loss(r.path + ": no 'optimizer' entry");
    opt = mapping_of(opt);
    if (!opt->is(Kind::kDict)) fail_data_loss(r.path + ": 'optimizer' is not a dict");
    return opt;
  }

  // Float16OptimizerWithFloat16Params (fp16/bf16 jobs) saves {"optimizer":
  // torch's state_dict, "fp32_from_fp16_params": the fp32 masters per group,
  // "grad_scaler" under fp16}; FP32Optimizer torch's state_dict alone.
  bool mixed_precision_plain() const {
    return !bool_arg("use_distributed_optimizer") && ranks_.at(0).decoded &&
           plain_optimizer(ranks_.at(0))->get("fp32_from_fp16_params") != nullptr;
  }

  // The plain optimizer's state of rank `r` (torch Adam's state_dict under
  // `optimizer`, and the mixed-precision wrapper's fp32 masters): state
  // indices named by megatron-core 0.16's param groups.
  std::vector<std::map<std::string, ValuePtr>> plain_state(RankFile& r, const std::vector<std::string>& kinds) {
    ValuePtr opt = plain_optimizer(r);
    ValuePtr masters = opt->get("fp32_from_fp16_params");
    if (masters) {
      opt = mapping_of(opt->at("optimizer"));
      if (!opt->is(Kind::kDict))
        fail_data_loss(r.path + ": 'optimizer' of the mixed-precision optimizer is not a dict");
    } else if (opt->get("optimizer")) {
      fail(ErrorCode::kUnimplemented, r.path +
                                          ": an 'optimizer' entry wrapping another 'optimizer' without "
                                          "fp32_from_fp16_params: not a plain optimizer ckptconv knows");
    }
    if ((masters != nullptr) != (std::find(kinds.begin(), kinds.end(), "param") != kinds.end()))
      fail_data_loss(r.path + ": fp32_from_fp16_params " + (masters ? "present" : "absent") +
                     ", unlike in TP 0 / PP 0's file; one job saves one kind of optimizer");
    if (ValuePtr d = args_->get("decoupled_lr"); d && !d->is(Kind::kNone))
      refuse_arg(r, "decoupled_lr", "it adds a param group of embedding and output parameters");
    if (bool_arg("apply_wd_to_qk_layernorm"))
      refuse_arg(r, "apply_wd_to_qk_layernorm", "it moves q/k layer norms into the weight-decay group");
    ValuePtr state = mapping_of(opt->at("state"));
    std::map<int64_t, ValuePtr> by_index;  // torch's state by parameter index
    for (const auto& [k, val] : state->entries)
      if (k->is(Kind::kInt)) by_index.emplace(k->int_value, val);
    const int64_t chunks = std::max<int64_t>(degrees_.vpp, 1);
    std::vector<std::pair<std::size_t, LocalParam>> all;  // (chunk, parameter), chunk after chunk
    std::vector<std::vector<LocalParam>> params;
    for (int64_t v = 0; v < chunks; ++v) {
      params.push_back(chunk_params(r, v));
      for (const LocalParam& p : params.back()) all.emplace_back(static_cast<std::size_t>(v), p);
    }
    std::vector<std::map<std::string, std::map<std::string, ValuePtr>>> found(params.size());
    std::size_t named = 0;
    const auto& groups = opt->at("param_groups")->as_sequence();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::string what = r.path + ": optimizer param group " + std::to_string(g);
      ValuePtr group = mapping_of(groups[g]);
      auto number = [&](std::string_view key, double fallback) {
        ValuePtr x = group->get(key);
        return x && (x->is(Kind::kInt) || x->is(Kind::kFloat)) ? x->as_number() : fallback;
      };
      auto flag = [&](std::string_view key) {
        ValuePtr x = group->get(key);
        return x && x->is(Kind::kBool) && x->as_bool();
      };
      const double wd_mult = number("wd_mult", -1);
      if ((wd_mult != 0.0 && wd_mult != 1.0) || number("lr_mult", 1) != 1.0 || flag("is_decoupled_lr") ||
          flag("is_expert_parallel"))
        fail(ErrorCode::kUnimplemented,
             what + " (" + group->repr(1) +
                 ") is not one of megatron-core 0.16's standard groups (weight decay, or wd_mult 0 for biases and "
                 "1-d parameters); which parameters it holds is not guessed");
      const bool no_wd = wd_mult == 0.0;
      std::vector<const std::pair<std::size_t, LocalParam>*> members;
      for (const auto& cp : all)
        if (no_weight_decay_v016(cp.second) == no_wd) members.push_back(&cp);
      const auto& indices = group->at("params")->as_sequence();
      std::vector<ValuePtr> group_masters;
      if (masters) {
        const auto& all_masters = masters->as_sequence();
        if (g >= all_masters.size()) fail_data_loss(what + ": no fp32_from_fp16_params for it");
        group_masters = all_masters[g]->as_sequence();
      }
      std::size_t next_master = 0;
      if (indices.size() != members.size())
        fail(ErrorCode::kUnimplemented,
             what + " holds " + std::to_string(indices.size()) + " parameters; megatron-core 0.16's rule (" +
                 (no_wd ? "biases and 1-d parameters" : "the parameters that are neither") + ") gives " +
                 std::to_string(members.size()) + " of this rank's model: not a grouping ckptconv knows");
      for (std::size_t j = 0; j < indices.size(); ++j) {
        const auto& [v, p] = *members[j];
        const int64_t idx = indices[j]->as_int();
        auto found_entry = by_index.find(idx);
        ValuePtr entry = found_entry == by_index.end() ? nullptr : mapping_of(found_entry->second);
        if (!entry)
          fail_data_loss(what + ": no optimizer state for parameter " + std::to_string(idx) + " (" + p.name + ")");
        for (const std::string& kind : kinds) {
          if (kind == "param") continue;  // the master: fp32_from_fp16_params, below
          ValuePtr val = entry->at(kind);
          const TensorEntry* t = tensor_of(*r.decoded, *val);
          if (!t || t->shape != p.shape)
            fail(ErrorCode::kUnimplemented, r.path + ": optimizer state " + std::to_string(idx) + " '" + kind +
                                                "' is " + (t ? shape_str(t->shape) : std::string("not a tensor")) +
                                                ", but megatron-core 0.16's grouping " + "names it " + p.name +
                                                " of shape " + shape_str(p.shape) + ": not a grouping ckptconv knows");
          found[v][p.name][kind] = val;
        }
        if (masters) {
          // The fp32 masters of the group's 16-bit parameters, in order. A
          // group mixing fp32 parameters in (no master of their own) is not
          // what Megatron-LM's Float16Module makes, and megatron-core's own
          // sharded save of one pairs masters with the wrong parameters.
          if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
            fail(ErrorCode::kUnimplemented, what + ": " + p.name + " is " + std::string(dtype_name(p.dtype)) +
                                                " under the mixed-precision optimizer; only all-16-bit groups are "
                                                "known");
          if (next_master >= group_masters.size())
            fail_data_loss(what + ": fewer fp32_from_fp16_params than 16-bit parameters");
          ValuePtr master = group_masters[next_master++];
          const TensorEntry* t = tensor_of(*r.decoded, *master);
          if (!t || t->shape != p.shape || t->dtype != DType::kFloat32)
            fail(ErrorCode::kUnimplemented, what + ": fp32_from_fp16_params entry " + std::to_string(next_master - 1) +
                                                " is not a float32 " + shape_str(p.shape) + " (the master of " +
                                                p.name + " by megatron-core 0.16's grouping)");
          found[v][p.name]["param"] = master;
        }
        check_common_step(r, entry, p.name);
        ++named;
      }
      if (next_master != group_masters.size())
        fail_data_loss(what + ": " + std::to_string(group_masters.size()) + " fp32_from_fp16_params for " +
                       std::to_string(next_master) + " 16-bit parameters");
    }
    if (named != all.size())
      fail(ErrorCode::kUnimplemented, r.path + ": the optimizer's param groups hold " + std::to_string(named) +
                                          " parameters, the rank's model " + std::to_string(all.size()));
    std::vector<std::map<std::string, ValuePtr>> out(params.size());
    for (std::size_t v = 0; v < out.size(); ++v)
      for (const std::string& kind : kinds) {
        out[v][kind] = Value::dict();
        for (const LocalParam& p : params[v])
          out[v][kind]->entries.emplace_back(Value::str(p.name), found[v].at(p.name).at(kind));
      }
    return out;
  }

  // torch Adam keeps a `step` per parameter; megatron-core steps them all
  // together (its own sharded save keeps one common step), so every one
  // must be equal. The first is kept for param_groups.
  void check_common_step(const RankFile& r, const ValuePtr& entry, const std::string& name) {
    ValuePtr step = entry->get("step");
    const TensorEntry* t = step ? tensor_of(*r.decoded, *step) : nullptr;
    if (!t) return;  // a float step (older torch): left out
    if (!step_) {
      step_ = *t;
    } else if (!same_tensor_values(*t, *step_)) {
      fail_data_loss(r.path + ": the optimizer's step of " + name +
                     " differs from the others'; megatron-core steps every parameter together");
    }
  }

  // TP 0 / PP 0's optimizer param_groups without their `params` (indices
  // into one rank's parameters, which mean nothing in the merged state; the
  // distributed optimizer saves none), as the torch_dist view gives them.
  // The plain optimizer's common step (see check_common_step) goes into
  // each group as `step`, where the distributed optimizer keeps it.
  ValuePtr param_groups(CheckpointModel& model) {
    ValuePtr out = Value::list({});
    ValuePtr opt = mapping_of(ranks_.at(0).decoded->root->at("optimizer"));
    // The DistributedOptimizer (and the mixed-precision wrapper) keep the
    // inner optimizer's state dict under `optimizer`.
    if (opt->is(Kind::kDict) && opt->get("optimizer")) opt = mapping_of(opt->get("optimizer"));
    ValuePtr groups = opt->is(Kind::kDict) ? opt->get("param_groups") : nullptr;
    if (!groups) return out;
    ValuePtr step;
    if (step_) {
      model.tensors.push_back(*step_);
      model.tensors.back().name = "param_groups.step";
      step = make_tensor_ref(model.tensors.size() - 1);
    }
    for (const ValuePtr& g : groups->as_sequence()) {
      ValuePtr copy = Value::dict();
      for (const auto& [k, val] : mapping_of(g)->entries)
        if (!(k->is(Kind::kStr) && k->as_str() == "params")) copy->entries.emplace_back(k, val);
      if (step && !copy->get("step")) copy->entries.emplace_back(Value::str("step"), step);
      out->items.push_back(copy);
    }
    return out;
  }

  std::string dir_;
  ProblemSink* sink_;
  std::string only_;
  ValuePtr args_;
  Degrees degrees_;
  std::vector<RankFile> ranks_;  // pp-major, tp-minor
  int64_t iteration_ = -1;
  bool complete_ = true;
  std::vector<std::string> optim_files_;  // the distrib_optim.pt files read
  std::optional<TensorEntry> step_;       // the plain optimizer's common step (check_common_step)
};

}  // namespace

bool is_iteration_dir(const std::string& dir) {
  if (!is_directory(dir)) return false;
  for (const DirEntry& e : list_directory(dir))
    if (e.is_directory() && parse_rank_folder(e.name)) return true;
  return false;
}

int rank_folder_count(const std::string& dir) {
  int n = 0;
  for (const DirEntry& e : list_directory(dir)) n += e.is_directory() && parse_rank_folder(e.name) ? 1 : 0;
  return n;
}

std::optional<std::string> tracker_folder(const std::string& root) {
  const std::string path = (fs::path(root) / kTrackerFile).string();
  if (!is_regular_file(path)) return std::nullopt;
  std::string text = read_small_file(path, kMaxTrackerBytes);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text == "release") return text;
  const bool number = !text.empty() && text.size() <= 12 &&
                      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!number)
    fail_data_loss(path + ": holds '" + printable_text(text.substr(0, 32)) +
                   "', not an iteration number or 'release' (Megatron-LM's tracker file)");
  std::string digits = std::to_string(std::stoll(text));
  return "iter_" + std::string(digits.size() < 7 ? 7 - digits.size() : 0, '0') + digits;
}

CheckpointModel read_legacy(const std::string& dir, ProblemSink* problems, const std::string& only) {
  return LegacyReader(dir, problems, only).read();
}

}  // namespace ckpt::megatron_legacy
