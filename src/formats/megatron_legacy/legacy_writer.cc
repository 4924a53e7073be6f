#include "formats/megatron_legacy/legacy_writer.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "formats/megatron_legacy/legacy_reader.h"
#include "formats/megatron_legacy/optim_layout.h"
#include "formats/megatron_legacy/tp_layout.h"
#include "io/byte_source.h"
#include "model/flat_range.h"
#include "model/tree_walk.h"

namespace ckpt::megatron_legacy {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

int64_t int_entry(const ValuePtr& args, std::string_view key, int64_t fallback) {
  ValuePtr v = args->get(key);
  return v && v->is(Kind::kInt) ? v->int_value : fallback;
}

bool bool_entry(const ValuePtr& args, std::string_view key) {
  ValuePtr v = args->get(key);
  return v && v->is(Kind::kBool) && v->as_bool();
}

// `dict` with `key` set to `value` where it has the key (the Namespace's
// attributes Megatron-LM's own parse_args made; none is added).
void set_existing(const ValuePtr& dict, std::string_view key, ValuePtr value) {
  for (auto& [k, v] : dict->entries)
    if (k->is(Kind::kStr) && k->as_str() == key) v = std::move(value);
}

// Appends the chunks of `t` that cover [from, from + count) of dim `dim`,
// cut to that range and placed at `at` on that dim.
void add_range(const TensorEntry& t, std::size_t dim, int64_t from, int64_t count, int64_t at,
               std::vector<TensorChunk>& out) {
  for (const TensorChunk& c : t.chunks) {
    const int64_t lo = std::max(from, c.offsets[dim]);
    const int64_t hi = std::min(from + count, c.offsets[dim] + c.sizes[dim]);
    if (lo >= hi) continue;
    TensorChunk piece = c;
    piece.storage_offset += (lo - c.offsets[dim]) * c.strides[dim];
    piece.sizes[dim] = hi - lo;
    piece.offsets[dim] = at + (lo - from);
    out.push_back(std::move(piece));
  }
}

// Megatron-LM's _vocab_size_with_padding: the vocabulary rounded up to a
// multiple of make_vocab_size_divisible_by x TP.
int64_t padded_vocab(int64_t vocab, int64_t divisible_by, int tp) {
  const int64_t multiple = divisible_by * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

bool is_16_bit(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16; }

// A 0-d float32 tensor holding `value`: torch Adam's per-parameter step,
// made from the distributed optimizer's number (its param groups keep the
// step as a float), so that the rank file holds what a plain optimizer saves.
TensorEntry scalar_float32(double value, std::string name) {
  const float f = static_cast<float>(value);
  std::string bytes(sizeof f, '\0');
  std::memcpy(bytes.data(), &f, sizeof f);  // little-endian, as torch.save writes on this host
  TensorChunk c;
  c.storage = make_memory_source(std::move(bytes), "<step>");
  TensorEntry t;
  t.name = std::move(name);
  t.dtype = DType::kFloat32;
  t.chunks.push_back(std::move(c));
  return t;
}

// A parameter a rank file's model holds: its TP=1 name (the optimizer
// view's) and its piece among the file's tensors.
struct RankParam {
  std::string name;
  std::size_t tensor = 0;
};

class LegacyPlanner {
 public:
  LegacyPlanner(const CheckpointModel& legacy, const CheckpointModel* optim, int tp, int pp,
                std::optional<bool> distributed, int vpp)
      : legacy_(legacy), optim_(optim), tp_(tp), pp_(pp), vpp_(vpp), requested_distributed_(distributed) {}

  LegacyOutput run() {
    ValuePtr root = mapping_of(legacy_.root);
    ValuePtr model = root->is(Kind::kDict) ? root->get("model") : nullptr;
    args_ = root->is(Kind::kDict) ? root->get("args") : nullptr;
    const bool megatron =
        legacy_.info.kind == SourceKind::kMegatronLegacy || legacy_.info.kind == SourceKind::kMegatron || from_hf();
    if (!megatron || !model || !args_)
      fail_invalid(legacy_.source +
                   ": --layout megatron-legacy writes a Megatron-LM legacy checkpoint, or a Megatron-LM job's "
                   "torch_dist one, read whole (no --only): its TP=1/PP=1 model and its args, which the rank files "
                   "carry with the new TP and PP (this source holds no Megatron-LM args: a Hugging Face folder takes "
                   "them from --args-from CKPT; --layout megatron writes it as torch_dist, which Megatron-LM loads "
                   "with --ckpt-format torch_dist)");
    args_ = mapping_of(args_);
    model = mapping_of(model);
    settle_model(model);
    settle_optim();
    // Megatron-LM seeds each rank's RNGs by its TP and PP rank and itself
    // ignores a torch_dist checkpoint's RNG state at another TP x PP; a
    // legacy load has no such check, so the flag is the job's to pass.
    log::warn(legacy_.source + ": the RNG states are not written (" +
              (optim_                                             ? "the optimizer is"
               : legacy_.info.kind == SourceKind::kMegatronLegacy ? "neither is the optimizer: the source saved none"
               : from_hf() ? "neither is the optimizer: a Hugging Face folder holds none"
                           : "neither is the optimizer") +
              "): load the output with --no-load-rng" + (optim_ ? "" : " --no-load-optim") +
              (from_hf() ? ", or with --finetune, as a model Megatron-LM's own converter wrote" : ""));
    LegacyOutput out;
    auto it = legacy_.facts.find("megatron iteration");
    const bool release = it != legacy_.facts.end() && it->second == "release";
    ValuePtr iteration = root->get("iteration");
    if (!release && !(iteration && iteration->is(Kind::kInt)))
      fail_data_loss(legacy_.source + ": no integer 'iteration' beside the model");
    out.tracker = release ? "release" : std::to_string(iteration->int_value);
    std::string folder = "release";
    if (!release) {
      folder = std::to_string(iteration->int_value);
      folder = "iter_" + std::string(folder.size() < 7 ? 7 - folder.size() : 0, '0') + folder;
    }
    ValuePtr args = new_args();
    const std::vector<std::pair<std::string, ValuePtr>> entries = model_entries(model);
    for (int p = 0; p < pp_; ++p)
      for (int t = 0; t < tp_; ++t) {
        LegacyRankFile file;
        file.name = folder + "/" + rank_folder_name(t, p, 0, pp_, 1) + "/" + kRankFile;
        // One model per virtual stage (model0..model<V-1>), or `model`.
        std::vector<ValuePtr> rank_models(static_cast<std::size_t>(vpp_));
        std::vector<std::vector<RankParam>> chunk_params(rank_models.size());
        std::vector<RankParam> params;  // chunk after chunk, as the optimizer numbers them
        ValuePtr optimizer;
        std::optional<LegacyRankFile> distrib_optim;
        with_context(file.name, [&] {
          for (int v = 0; v < vpp_; ++v) {
            auto& into = rank_models[static_cast<std::size_t>(v)];
            into = Value::dict();
            auto& chunk = chunk_params[static_cast<std::size_t>(v)];
            for (const auto& [name, value] : entries) add_entry(name, value, t, p, v, into, file.tensors, chunk);
            params.insert(params.end(), chunk.begin(), chunk.end());
          }
          if (optim_ && distributed_) {
            optimizer = distopt_rank_entry();
            distrib_optim = distopt_file(t, p, chunk_params, file.tensors);
            distrib_optim->name = folder + "/" + rank_folder_name(t, p, 0, pp_, 1) + "/" + kDistribOptimFile;
          } else if (optim_) {
            optimizer = rank_optimizer(t, params, file.tensors);
          }
        });
        file.root = Value::dict();
        for (const auto& [k, v] : root->entries) {
          const std::string key = path_component(*k);
          if (key == "model" && vpp_ > 1) {
            for (int c = 0; c < vpp_; ++c)
              file.root->entries.emplace_back(Value::str("model" + std::to_string(c)),
                                              rank_models[static_cast<std::size_t>(c)]);
          } else {
            file.root->entries.emplace_back(k, key == "model" ? rank_models[0] : key == "args" ? args : v);
          }
          // Where Megatron-LM's generate_state_dict puts it: after the model.
          if (key == "model" && optimizer) file.root->entries.emplace_back(Value::str("optimizer"), optimizer);
        }
        out.files.push_back(std::move(file));
        if (distrib_optim) out.files.push_back(std::move(*distrib_optim));
      }
    return out;
  }

 private:
  // A Hugging Face folder's model with a Megatron-LM job's args (--args-from).
  bool from_hf() const { return legacy_.facts.count(std::string(kArgsFromFact)) > 0; }

  // The optimizer view: its state per parameter name and its groups (the
  // plain optimizer's step in each, which torch keeps per parameter).
  void settle_optim() {
    if (!optim_) {
      if (requested_distributed_.value_or(false))
        fail_invalid(legacy_.source +
                     ": --distributed-optimizer: the source saved no optimizer (--no-save-optim), "
                     "so there is none to write as distrib_optim.pt");
      return;
    }
    distributed_ = requested_distributed_.value_or(bool_entry(args_, "use_distributed_optimizer"));
    // What the reader refuses of a distributed source, the writer does not
    // write for one either: megatron-core 0.16's rules (optim_layout) give
    // no buffer layout for them.
    if (distributed_ && int_entry(args_, "mtp_num_layers", 0) > 0)
      fail(ErrorCode::kUnimplemented, legacy_.source + ": args.mtp_num_layers " +
                                          std::to_string(int_entry(args_, "mtp_num_layers", 0)) +
                                          ": multi-token prediction keeps another copy of the embeddings, which "
                                          "distrib_optim.pt's layout rules here do not place; write the plain "
                                          "optimizer (--no-distributed-optimizer)");
    if (distributed_ && int_entry(args_, "num_distributed_optimizer_instances", 1) != 1)
      fail(ErrorCode::kUnimplemented, legacy_.source + ": args.num_distributed_optimizer_instances " +
                                          std::to_string(int_entry(args_, "num_distributed_optimizer_instances", 1)) +
                                          ": a partial distributed optimizer is not written; write the plain "
                                          "optimizer (--no-distributed-optimizer)");
    distopt_args_ = distopt_args_v016(*args_);
    ValuePtr root = mapping_of(optim_->root);
    ValuePtr view = root->is(Kind::kDict) ? root->get("optim") : nullptr;
    if (!view) fail(ErrorCode::kInternal, legacy_.source + ": the optimizer view holds no 'optim' entry");
    view = mapping_of(view);
    optim_state_ = mapping_of(view->at("state"));
    optim_groups_ = view->at("param_groups")->as_sequence();
  }

  // The optimizer state of the TP=1 parameter `name`. A tied model's output
  // layer copy (written at PP > 1) has the embedding's where the source
  // kept no copy: the two get the same gradient, so the same state.
  ValuePtr state_of(const std::string& name) const {
    ValuePtr s = optim_state_->get(name);
    if (!s && tied_ && name == "output_layer.weight") s = optim_state_->get("embedding.word_embeddings.weight");
    if (!s) fail_data_loss(legacy_.source + ": the optimizer holds no state for '" + name + "'");
    return mapping_of(s);
  }

  // TP rank t's piece of the optimizer tensor `ref` (shaped like the
  // parameter `name`, cut as it is), added to `tensors` as `label`.
  ValuePtr optim_piece(const ValuePtr& ref, const std::string& name, int t, const std::string& label,
                       std::vector<TensorEntry>& tensors) const {
    tensors.push_back(state_piece(ref, name, t, label));
    tensors.back().name = label;
    return make_tensor_ref(tensors.size() - 1);
  }

  // TP rank t's piece of the optimizer tensor `ref`, for the plain
  // optimizer's entry or a distrib_optim.pt buffer.
  TensorEntry state_piece(const ValuePtr& ref, const std::string& name, int t, const std::string& label) const {
    auto idx = ref ? tensor_ref_index(*ref) : std::nullopt;
    if (!idx) fail_data_loss(legacy_.source + ": the optimizer's " + label + " is not a tensor");
    return tp_piece(optim_->tensors.at(*idx), name, t);
  }

  // A rank file's `optimizer` under the distributed optimizer, as megatron-
  // core 0.16's DistributedOptimizer.state_dict gives it without Apex or TE
  // (Megatron-LM's generate_state_dict for ckpt_format=torch): the inner
  // optimizer's param_groups without `params`, the common step in each as a
  // number; the states themselves are in distrib_optim.pt.
  ValuePtr distopt_rank_entry() const {
    std::vector<ValuePtr> groups;
    for (const ValuePtr& g : optim_groups_) {
      ValuePtr copy = Value::dict();
      for (const auto& [k, v] : mapping_of(g)->entries) {
        const std::string key = path_component(*k);
        if (key == "step")
          copy->entries.emplace_back(k, Value::floating(step_number(v)));
        else if (key != "params")
          copy->entries.emplace_back(k, v);
      }
      if (!copy->get("step")) fail_data_loss(legacy_.source + ": an optimizer param group without a step");
      groups.push_back(copy);
    }
    return Value::dict(
        {{Value::str("optimizer"), Value::dict({{Value::str("param_groups"), Value::list(std::move(groups))}})}});
  }

  // The step as the distributed optimizer keeps it (torch's 0-d float32
  // step .item()): the view's number, or the plain optimizer's tensor read.
  double step_number(const ValuePtr& step) const {
    if (step->is(Kind::kInt) || step->is(Kind::kFloat)) return step->as_number();
    auto at = tensor_ref_index(*step);
    if (!at) fail_data_loss(legacy_.source + ": the optimizer's step is " + step->repr(1) + ", not a number or tensor");
    const TensorEntry& t = optim_->tensors.at(*at);
    if (t.dtype != DType::kFloat32 || t.numel() != 1 || t.chunks.size() != 1 || t.chunks[0].big_endian)
      fail(ErrorCode::kUnimplemented, legacy_.source + ": the optimizer's step is a " +
                                          std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape) +
                                          " tensor, not torch Adam's 0-d float32 step");
    float f = 0;
    const TensorChunk& c = t.chunks[0];
    c.storage->read(static_cast<uint64_t>(c.storage_offset) * sizeof f, &f, sizeof f);
    return f;
  }

  // TP rank t / PP rank p's distrib_optim.pt, as megatron-core 0.16's
  // DistributedOptimizer.save_parameter_state writes it for this rank's
  // model (optim_layout.h): per grad buffer the fp32 master and Adam
  // moments of its parameters, each the rank's TP piece of the state laid
  // at its place, zeros between. An fp32 model's master is its weight
  // (the plain optimizer keeps none apart).
  LegacyRankFile distopt_file(int t, int p, const std::vector<std::vector<RankParam>>& chunk_params,
                              const std::vector<TensorEntry>& model_tensors) const {
    std::vector<std::vector<LocalParam>> chunks(chunk_params.size());
    for (std::size_t c = 0; c < chunk_params.size(); ++c)
      for (const RankParam& rp : chunk_params[c]) {
        const TensorEntry& w = model_tensors[rp.tensor];
        chunks[c].push_back({w.name, w.shape, w.dtype});
      }
    const std::vector<FlatBuffer> buffers = distopt_rank_buffers_v016(chunks, distopt_args_, p, pp_);
    LegacyRankFile file;
    file.root = Value::dict({{Value::str("buckets_coalesced"), Value::boolean(true)}});
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      const FlatBuffer& b = buffers[i];
      ValuePtr states = Value::dict();
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
        TensorEntry flat;
        flat.name = "buffer " + std::to_string(i) + " " + kind;
        flat.dtype = DType::kFloat32;
        flat.shape = {static_cast<int64_t>(b.numel_unpadded)};
        uint64_t pos = 0;
        for (const FlatBuffer::Place& place : b.places) {
          const RankParam& rp = chunk_params.at(b.chunk).at(place.param);
          const TensorEntry& w = model_tensors[rp.tensor];
          ValuePtr s = state_of(rp.name);
          const std::string label = w.name + "." + kind;
          TensorEntry piece =
              std::string(kind) == "param" && !s->get("param") ? w : state_piece(s->get(kind), rp.name, t, label);
          if (piece.dtype != DType::kFloat32)
            fail(ErrorCode::kUnimplemented, legacy_.source + ": " + label + " is " +
                                                std::string(dtype_name(piece.dtype)) +
                                                ", and no fp32 master is saved for it; distrib_optim.pt holds fp32");
          append_zeros(flat, pos, place.start - pos);
          append_flat(flat, piece, place.start);
          pos = place.start + piece.numel();
        }
        append_zeros(flat, pos, b.numel_unpadded - pos);
        file.tensors.push_back(std::move(flat));
        states->entries.emplace_back(Value::str(kind), make_tensor_ref(file.tensors.size() - 1));
      }
      states->entries.emplace_back(Value::str("numel_unpadded"),
                                   Value::integer(static_cast<int64_t>(b.numel_unpadded)));
      ValuePtr dtypes = Value::tuple({Value::global("torch", std::string(dtype_name(b.param_dtype))),
                                      Value::global("torch", std::string(dtype_name(b.grad_dtype)))});
      file.root->entries.emplace_back(Value::integer(static_cast<int64_t>(i)), Value::dict({{dtypes, states}}));
    }
    return file;
  }

  // One rank's `optimizer` entry, as megatron-core 0.16's plain optimizer
  // over this rank's model saves it: torch Adam's state_dict, whose state
  // indices number the parameters group after group. _get_param_groups
  // gathers every rank's group keys, so each rank has the source's groups
  // in order (an empty one included), each holding the rank's parameters
  // its rule selects in model order. An fp32 model's FP32Optimizer saves
  // that alone (its master is the weight; a distributed optimizer's fp32
  // master is a view of it); a 16-bit model's Float16OptimizerWithFloat16Params
  // adds each group's fp32 masters in order.
  ValuePtr rank_optimizer(int t, const std::vector<RankParam>& params, std::vector<TensorEntry>& tensors) const {
    bool half = false, full = false;
    for (const RankParam& p : params) (is_16_bit(tensors[p.tensor].dtype) ? half : full) = true;
    if (half && full)
      fail(ErrorCode::kUnimplemented, legacy_.source +
                                          ": the model mixes 16-bit and fp32 parameters, which Megatron-LM's "
                                          "Float16Module never makes; no optimizer layout is known for it");
    ValuePtr state = Value::dict();
    std::vector<ValuePtr> groups, masters;
    int64_t index = 0;
    for (const ValuePtr& g : optim_groups_) {
      ValuePtr group = mapping_of(g);
      ValuePtr wd = group->get("wd_mult");
      const bool no_wd = wd && (wd->is(Kind::kInt) || wd->is(Kind::kFloat)) && wd->as_number() == 0.0;
      ValuePtr copy = Value::dict(), step;
      for (const auto& [k, v] : group->entries) {
        const std::string key = path_component(*k);
        if (key == "step")  // the view's common step: torch keeps it per parameter
          step = v;
        else if (key != "params")
          copy->entries.emplace_back(k, v);
      }
      if (!step) fail_data_loss(legacy_.source + ": an optimizer param group without a step");
      std::vector<ValuePtr> indices, group_masters;
      for (const RankParam& p : params) {
        const TensorEntry& w = tensors[p.tensor];
        if (no_weight_decay_v016({p.name, w.shape, w.dtype}) != no_wd) continue;
        ValuePtr s = state_of(p.name);
        const std::string label = w.name + ".";
        ValuePtr per = Value::dict();
        // A 0-d float32 tensor, as torch's Adam keeps it: the plain
        // optimizer's own, or made from the distributed optimizer's number.
        if (auto at = tensor_ref_index(*step)) {
          tensors.push_back(optim_->tensors.at(*at));
          tensors.back().name = label + "step";
        } else if (step->is(Kind::kInt) || step->is(Kind::kFloat)) {
          tensors.push_back(scalar_float32(step->as_number(), label + "step"));
        } else {
          fail_data_loss(legacy_.source + ": the optimizer's step is " + step->repr(1) + ", not a number or tensor");
        }
        per->entries.emplace_back(Value::str("step"), make_tensor_ref(tensors.size() - 1));
        for (const char* kind : {"exp_avg", "exp_avg_sq"})
          per->entries.emplace_back(Value::str(kind), optim_piece(s->get(kind), p.name, t, label + kind, tensors));
        if (half) {
          if (!s->get("param"))
            fail_data_loss(legacy_.source + ": no fp32 master of '" + p.name + "' for the 16-bit model's optimizer");
          group_masters.push_back(optim_piece(s->get("param"), p.name, t, label + "fp32_master", tensors));
        }
        state->entries.emplace_back(Value::integer(index), per);
        indices.push_back(Value::integer(index++));
      }
      copy->entries.emplace_back(Value::str("params"), Value::list(std::move(indices)));
      groups.push_back(copy);
      masters.push_back(Value::list(std::move(group_masters)));
    }
    if (index != static_cast<int64_t>(params.size()))
      fail(ErrorCode::kUnimplemented, legacy_.source + ": the optimizer's param groups take " + std::to_string(index) +
                                          " of the rank's " + std::to_string(params.size()) +
                                          " parameters; megatron-core 0.16's grouping would leave some out");
    ValuePtr torch_sd =
        Value::dict({{Value::str("state"), state}, {Value::str("param_groups"), Value::list(std::move(groups))}});
    if (!half) return torch_sd;
    return Value::dict(
        {{Value::str("optimizer"), torch_sd}, {Value::str("fp32_from_fp16_params"), Value::list(std::move(masters))}});
  }

  // What the model and the new degrees must agree on before anything is cut.
  void settle_model(const ValuePtr& model) {
    swiglu_ = bool_entry(args_, "swiglu");
    tied_ = !bool_entry(args_, "untie_embeddings_and_output_weights");
    for (const auto& [k, v] : model->entries)
      if (auto at = layer_index_in(path_component(*k))) num_layers_ = std::max(num_layers_, at->index + 1);
    if (const int64_t said = int_entry(args_, "num_layers", num_layers_); said != num_layers_)
      fail_data_loss(legacy_.source + ": the model holds " + std::to_string(num_layers_) + " layers, args.num_layers " +
                     std::to_string(said));
    if (vpp_ > 1 && pp_ < 2)
      fail_invalid("--vpp " + std::to_string(vpp_) +
                   ": virtual pipeline stages interleave over pipeline ranks; give --pp 2 or more");
    if (num_layers_ % (pp_ * vpp_))
      fail(ErrorCode::kUnimplemented, legacy_.source + ": " + std::to_string(num_layers_) +
                                          " layers do not divide into " + std::to_string(pp_ * vpp_) +
                                          (vpp_ > 1 ? " virtual" : "") +
                                          " pipeline stages (an uneven split is not written yet)");
    const int64_t heads = int_entry(args_, "num_attention_heads", -1);
    const int64_t groups =
        bool_entry(args_, "group_query_attention") ? int_entry(args_, "num_query_groups", -1) : heads;
    if (heads < 1 || groups < 1 || heads % tp_ || groups % tp_)
      fail(ErrorCode::kUnimplemented, legacy_.source + ": " + std::to_string(heads) + " attention heads in " +
                                          std::to_string(groups) + " query groups do not divide over TP " +
                                          std::to_string(tp_) + " (each TP rank holds whole query groups)");
    // The vocabulary padded as Megatron-LM pads it for the new TP. Rows past
    // the vocabulary are padding no token reads: dropped when the new TP
    // needs fewer; more would be rows the source does not have.
    const int64_t stored_rows = int_entry(args_, "padded_vocab_size", -1);
    const int64_t vocab = int_entry(args_, "vocab_size", -1);
    if (stored_rows < 1)
      fail_data_loss(legacy_.source + ": no args.padded_vocab_size, which Megatron-LM saves with every job");
    vocab_rows_ = stored_rows;
    if (vocab > 0) {
      vocab_rows_ = padded_vocab(vocab, int_entry(args_, "make_vocab_size_divisible_by", 128), tp_);
      if (vocab_rows_ > stored_rows)
        fail(ErrorCode::kUnimplemented,
             legacy_.source + ": at TP " + std::to_string(tp_) + " Megatron-LM pads the vocabulary of " +
                 std::to_string(vocab) + " to " + std::to_string(vocab_rows_) + " rows, more than the " +
                 std::to_string(stored_rows) + " stored; adding padding rows is not supported yet");
    }
    if (vocab_rows_ % tp_)
      fail(ErrorCode::kUnimplemented, legacy_.source + ": " + std::to_string(vocab_rows_) +
                                          " vocabulary rows do not divide over TP " + std::to_string(tp_) +
                                          " (set a vocabulary args.make_vocab_size_divisible_by pads to a multiple)");
  }

  // The model's entries by name, with tied embeddings (Megatron-LM's
  // default) as the new pipeline holds them: at PP > 1 the last stage keeps
  // a copy of the word embeddings as output_layer.weight (the reader keeps
  // a PP > 1 source's as stored; from a PP = 1 source it is the embedding's
  // tensor), at PP = 1 there is none.
  std::vector<std::pair<std::string, ValuePtr>> model_entries(const ValuePtr& model) const {
    std::vector<std::pair<std::string, ValuePtr>> out;
    const bool copy_needed = tied_ && pp_ > 1 && !model->get("output_layer.weight");
    ValuePtr embedding = model->get("embedding.word_embeddings.weight");
    if (copy_needed && !embedding)
      fail_data_loss(legacy_.source + ": tied embeddings, but no embedding.word_embeddings.weight");
    for (const auto& [k, v] : model->entries) {
      std::string name = path_component(*k);
      if (tied_ && pp_ == 1 && name == "output_layer.weight") continue;
      if (copy_needed && name == "output_layer._extra_state") out.emplace_back("output_layer.weight", embedding);
      out.emplace_back(std::move(name), v);
    }
    if (copy_needed && !model->get("output_layer._extra_state")) out.emplace_back("output_layer.weight", embedding);
    return out;
  }

  // args for the new job: Megatron-LM's load_checkpoint compares the TP and
  // PP sizes (check_checkpoint_args) and pads the vocabulary for its TP. No
  // virtual stages are written.
  ValuePtr new_args() const {
    auto args = std::make_shared<Value>(*args_);  // keeps `stored`: written back as the Namespace it was
    set_existing(args, "tensor_model_parallel_size", Value::integer(tp_));
    set_existing(args, "pipeline_model_parallel_size", Value::integer(pp_));
    set_existing(args, "transformer_pipeline_model_parallel_size", Value::integer(pp_));
    set_existing(args, "padded_vocab_size", Value::integer(vocab_rows_));
    set_existing(args, "ckpt_format", Value::str("torch"));  // a torch_dist job's args say torch_dist
    // The plain optimizer's `optimizer` entry is what a job without the
    // distributed optimizer reads; with it, distrib_optim.pt.
    if (optim_) set_existing(args, "use_distributed_optimizer", Value::boolean(distributed_));
    // Virtual stages: V of them per pipeline rank, said as
    // --num-virtual-stages-per-pipeline-rank says it (the layers per stage
    // follow from num_layers); none at V = 1.
    ValuePtr virtual_stages = vpp_ > 1 ? Value::integer(vpp_) : Value::none();
    set_existing(args, "virtual_pipeline_model_parallel_size", virtual_stages);
    // Megatron-LM's validate_args sets it under virtual pipelining (the
    // gpt_pp2_vpp2 fixture's args hold it; a job saved without one may not).
    if (vpp_ > 1 && !args->get("virtual_pipeline_model_parallel_size"))
      args->entries.emplace_back(Value::str("virtual_pipeline_model_parallel_size"), virtual_stages);
    set_existing(args, "num_virtual_stages_per_pipeline_rank", virtual_stages);
    set_existing(args, "num_layers_per_virtual_pipeline_stage", Value::none());
    return args;
  }

  // The model chunk (virtual stage v of pipeline rank p is chunk v P + p)
  // holding a model entry outside the layers: the embeddings are the
  // first chunk's, the final norm and output layer the last's.
  int chunk_of_unlayered(const std::string& name) const {
    if (name.rfind("embedding.", 0) == 0) return 0;
    if (name.rfind("decoder.", 0) == 0 || name.rfind("output_layer.", 0) == 0) return pp_ * vpp_ - 1;
    fail(ErrorCode::kUnimplemented, legacy_.source + ": model entry '" + name +
                                        "' is outside the layers, the embeddings, the decoder and the output layer; "
                                        "which pipeline stage holds it is not known here");
  }

  // Entry `name` of the TP=1/PP=1 model, as TP rank t / PP rank p holds it
  // in its virtual stage `vs` (if it does): under its chunk-local name,
  // its TP piece. Chunk vs P + p holds the (vs P + p)-th run of layers, as
  // Megatron-LM's interleaved schedule assigns them.
  void add_entry(const std::string& name, const ValuePtr& v, int t, int p, int vs, ValuePtr& into,
                 std::vector<TensorEntry>& tensors, std::vector<RankParam>& params) const {
    std::string local = name;
    const int64_t per_chunk = num_layers_ / (pp_ * vpp_);
    const int chunk = vs * pp_ + p;
    if (auto at = layer_index_in(name)) {
      if (at->index / per_chunk != chunk) return;
      local.replace(at->pos, at->len, std::to_string(at->index - chunk * per_chunk));
    } else if (chunk_of_unlayered(name) != chunk) {
      return;
    }
    auto idx = tensor_ref_index(*v);
    if (!idx) {  // an _extra_state object (None for the local spec): every rank's
      into->entries.emplace_back(Value::str(local), v);
      return;
    }
    tensors.push_back(tp_piece(legacy_.tensors.at(*idx), name, t));
    tensors.back().name = local;
    params.push_back({name, tensors.size() - 1});
    into->entries.emplace_back(Value::str(local), make_tensor_ref(tensors.size() - 1));
  }

  // TP rank t's piece of `full` (the TP=1 tensor of `name`).
  TensorEntry tp_piece(const TensorEntry& full, const std::string& name, int t) const {
    const bool vocab = name.find("word_embeddings.") != std::string::npos || name.rfind("output_layer.", 0) == 0;
    std::optional<TpSplit> split = tp_split_of(name, swiglu_);
    if (!split || (tp_ == 1 && !vocab)) {
      if (!split && tp_ > 1)
        fail(ErrorCode::kUnimplemented, "'" + name +
                                            "' is a parameter whose tensor-parallel layout ckptconv does not know; "
                                            "refusing to guess how to cut it for TP " +
                                            std::to_string(tp_));
      return full;
    }
    if (*split == TpSplit::kWhole || *split == TpSplit::kExtraState) return full;
    const std::size_t dim = *split == TpSplit::kDim1 ? 1 : 0;
    if (full.shape.size() <= dim)
      fail_data_loss("'" + name + "' of shape " + shape_str(full.shape) + " has no dim " + std::to_string(dim) +
                     " to cut for TP (" + tp_split_name(*split) + ")");
    TensorEntry out = full;
    out.chunks.clear();
    const int64_t rows = vocab ? vocab_rows_ : full.shape[dim];
    if (vocab && full.shape[0] < rows)
      fail_data_loss("'" + name + "' has " + std::to_string(full.shape[0]) + " rows, args.padded_vocab_size more");
    if (*split == TpSplit::kGatedDim0) {
      // [gate; up] at TP=1 -> [gate_t; up_t] on rank t.
      const int64_t half = rows / 2;
      if (rows % 2 || half % tp_)
        fail(ErrorCode::kUnimplemented, "'" + name + "' has " + std::to_string(rows) +
                                            " rows: [gate; up] halves that do not divide over TP " +
                                            std::to_string(tp_));
      const int64_t per = half / tp_;
      add_range(full, 0, t * per, per, 0, out.chunks);
      add_range(full, 0, half + t * per, per, per, out.chunks);
      out.shape[0] = 2 * per;
      return out;
    }
    if (rows % tp_)
      fail(ErrorCode::kUnimplemented, "'" + name + "' has " + std::to_string(rows) + " on dim " + std::to_string(dim) +
                                          ", which does not divide over TP " + std::to_string(tp_));
    const int64_t per = rows / tp_;
    add_range(full, dim, t * per, per, 0, out.chunks);
    out.shape[dim] = per;
    return out;
  }

  const CheckpointModel& legacy_;
  const CheckpointModel* optim_;
  int tp_, pp_, vpp_;
  ValuePtr optim_state_;
  std::vector<ValuePtr> optim_groups_;
  ValuePtr args_;
  std::optional<bool> requested_distributed_;  // --distributed-optimizer / --no-distributed-optimizer
  bool distributed_ = false;  // the optimizer is written as the DistributedOptimizer's: distrib_optim.pt
  DistoptArgs distopt_args_;  // the job's args that set distrib_optim.pt's layout
  bool swiglu_ = false, tied_ = false;
  int64_t num_layers_ = 0;
  int64_t vocab_rows_ = 0;
};

}  // namespace

namespace {

// The args a legacy rank file needs of the job and the writer reads: the
// model's sizes and layout, which a torch_dist checkpoint's tensors do not
// all say (heads, query groups, the vocabulary's padding, the layer spec).
constexpr const char* kArgsNeeded[] = {"num_layers",
                                       "hidden_size",
                                       "num_attention_heads",
                                       "padded_vocab_size",
                                       "swiglu",
                                       "untie_embeddings_and_output_weights",
                                       "transformer_impl",
                                       "group_query_attention"};

// `views`' entry `key` (a dict of names) with each layer entry under its
// module's name (the keys map backwards).
ValuePtr module_names(const ValuePtr& stored, bool local_spec, const std::string& source) {
  ValuePtr out = Value::dict();
  std::set<std::string> seen;
  for (const auto& [k, v] : mapping_of(stored)->entries) {
    std::string name = path_component(*k);
    if (auto at = layer_index_in(name)) {
      const std::size_t rest = at->pos + at->len + 1;
      name = name.substr(0, rest) + module_layer_name(name.substr(rest), local_spec);
    }
    if (!seen.insert(name).second) fail_data_loss(source + ": two stored entries are the module's '" + name + "'");
    out->entries.emplace_back(Value::str(name), v);
  }
  return out;
}

}  // namespace

LegacySource legacy_source_of_torch_dist(const CheckpointModel& whole,
                                         const std::function<CheckpointModel()>& read_views) {
  ValuePtr root = mapping_of(whole.root);
  ValuePtr args = root->is(Kind::kDict) ? root->get("args") : nullptr;
  if (!whole.info.megatron || !args)
    fail(ErrorCode::kUnimplemented,
         whole.source +
             ": no Megatron-LM args in common.pt (megatron-core saved this checkpoint without Megatron-LM's common "
             "state); a legacy rank file carries the job's args (its sizes, vocabulary padding and layer spec), "
             "which ckptconv does not make up. Load it with --ckpt-format torch_dist, or reshard it with --layout "
             "megatron --world-size N");
  args = mapping_of(args);
  std::string missing;
  for (const char* key : kArgsNeeded)
    if (!args->get(key)) missing += (missing.empty() ? "" : ", ") + std::string(key);
  if (!missing.empty())
    fail(ErrorCode::kUnimplemented, whole.source + ": common.pt's args lack " + missing +
                                        ", which a legacy rank file needs (Megatron-LM's parse_args sets them all)");
  ValuePtr impl = args->get("transformer_impl");
  const std::string spec = impl->is(Kind::kStr) ? impl->as_str() : "";
  if (spec != "local" && spec != "transformer_engine")
    fail(ErrorCode::kUnimplemented, whole.source + ": args.transformer_impl is " + impl->repr() +
                                        "; the stored names of megatron-core's local and transformer_engine GPT "
                                        "layer specs are known");
  const bool local_spec = spec == "local";
  const CheckpointModel views = read_views();
  ValuePtr view_root = mapping_of(views.root);
  ValuePtr model = module_names(view_root->at("model"), local_spec, whole.source);
  // GPTModel.sharded_state_dict leaves the output layer's extra state out;
  // its state_dict (what a legacy file holds) has it, None for the local
  // spec's ColumnParallelLinear, and load_state_dict(strict=True) wants it.
  if (!model->get("output_layer._extra_state"))
    model->entries.emplace_back(Value::str("output_layer._extra_state"), Value::none());
  LegacySource out;
  out.model = views;
  out.model.source = whole.source;
  out.model.root = Value::dict();
  // The job's entries in the order Megatron-LM's generate_state_dict puts
  // them (args, checkpoint_version, iteration, then the model), the others
  // in common.pt's. The optimizer's param groups travel in its view.
  std::vector<std::string> keys = {"args", "checkpoint_version", "iteration"};
  for (const std::string& key : whole.info.megatron->common_keys)
    if (key != "optimizer" && std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i == 3) out.model.root->entries.emplace_back(Value::str("model"), model);
    ValuePtr v = root->get(keys[i]);
    if (!v) continue;
    if (pickle::find_node(*v, [](const Value& x) { return tensor_ref_index(x).has_value(); }))
      fail(ErrorCode::kUnimplemented, whole.source + ": common.pt's '" + keys[i] +
                                          "' holds a tensor; the job's entries are written from plain values only");
    out.model.root->entries.emplace_back(Value::str(keys[i]), v);
  }
  if (!out.model.root->get("model")) out.model.root->entries.emplace_back(Value::str("model"), model);
  if (ValuePtr optim = view_root->get("optim")) {
    optim = mapping_of(optim);
    out.optim = views;
    out.optim->source = whole.source;
    out.optim->root =
        Value::dict({{Value::str("optim"),
                      Value::dict({{Value::str("state"), module_names(optim->at("state"), local_spec, whole.source)},
                                   {Value::str("param_groups"), optim->at("param_groups")}})}});
  }
  return out;
}

ValuePtr megatron_lm_args(const CheckpointModel& job) {
  ValuePtr root = mapping_of(job.root);
  ValuePtr args = root && root->is(Kind::kDict) ? root->get("args") : nullptr;
  if (!args || !mapping_of(args)->is(Kind::kDict))
    fail(ErrorCode::kUnimplemented,
         "--args-from " + job.source + ": no Megatron-LM args in it (" +
             (job.info.kind == SourceKind::kMegatron
                  ? "common.pt holds none: megatron-core saved it without Megatron-LM's common state"
                  : "its rank files hold none") +
             "); a legacy rank file carries the job's args, which ckptconv does not make up");
  return args;
}

int64_t vocab_multiple(const ValuePtr& args, int tp) {
  return std::max<int64_t>(1, int_entry(mapping_of(args), "make_vocab_size_divisible_by", 128)) * tp;
}

namespace {

// What the folder's tensors say of one field the layout depends on, and
// what the args say of it: a disagreement is named with both.
class ArgsCheck {
 public:
  ArgsCheck(const CheckpointModel& hf, ValuePtr model, ValuePtr args, std::string job)
      : hf_(hf), model_(std::move(model)), args_(std::move(args)), job_(std::move(job)) {}

  const std::vector<int64_t>* shape(const std::string& name) const {
    ValuePtr v = model_->get(name);
    auto at = v ? tensor_ref_index(*v) : std::nullopt;
    return at ? &hf_.tensors.at(*at).shape : nullptr;
  }
  bool has(const std::string& name) const { return shape(name) != nullptr; }
  // A tensor the check needs: its absence is a disagreement of its own.
  const std::vector<int64_t>& need(const std::string& name) {
    if (const auto* s = shape(name)) return *s;
    fail(ErrorCode::kUnimplemented,
         hf_.source + ": no tensor '" + name + "' after the way back; the layout of a Megatron-LM GPT needs it");
  }
  std::string said(std::string_view key) const {
    ValuePtr v = args_->get(key);
    return v ? v->repr(1) : "absent";
  }
  void field(const std::string& key, bool agrees, const std::string& folder) {
    if (!agrees) problems_ += "\n  args." + key + " is " + said(key) + ", but " + folder;
  }
  void finish() const {
    if (!problems_.empty())
      fail(ErrorCode::kUnimplemented, hf_.source + ": the args of --args-from " + job_ +
                                          " do not describe this model (nothing written); in its args:" + problems_);
  }

 private:
  const CheckpointModel& hf_;
  ValuePtr model_, args_;
  std::string job_;
  std::string problems_;
};

std::string str_entry(const ValuePtr& args, std::string_view key) {
  ValuePtr v = args->get(key);
  return v && v->is(Kind::kStr) ? v->as_str() : "";
}

// Every field of `args` the rank files' layout depends on (what the writer
// and megatron-core's GPT built from these args consult), against the
// TP=1 tensors of `model` (module names).
void check_args_against_model(const CheckpointModel& hf, const ValuePtr& model, const ValuePtr& args,
                              const std::string& job, const std::optional<HfVocab>& hf_vocab, bool local_spec) {
  ArgsCheck c(hf, model, args, job);
  const std::string l0 = "decoder.layers.0.";
  int64_t layers = 0;
  for (const auto& [k, v] : model->entries)
    if (auto at = layer_index_in(path_component(*k))) layers = std::max(layers, at->index + 1);
  c.field("num_layers", int_entry(args, "num_layers", -1) == layers,
          "the folder holds " + std::to_string(layers) + " layers");
  const auto& embedding = c.need("embedding.word_embeddings.weight");
  const int64_t hidden = embedding.at(1);
  c.field("hidden_size", int_entry(args, "hidden_size", -1) == hidden,
          "the folder's word embeddings are " + std::to_string(hidden) + " wide");
  const int64_t heads = int_entry(args, "num_attention_heads", -1);
  const int64_t kv = int_entry(args, "kv_channels", heads > 0 ? hidden / heads : -1);
  const auto& proj = c.need(l0 + "self_attention.linear_proj.weight");
  const auto& qkv = c.need(l0 + "self_attention.linear_qkv.weight");
  c.field("kv_channels", kv > 0 && proj.at(1) % kv == 0,
          "linear_proj's " + std::to_string(proj.at(1)) + " input columns are no whole number of heads of " +
              std::to_string(kv) + " channels");
  if (kv > 0 && proj.at(1) % kv == 0) {
    c.field("num_attention_heads", heads == proj.at(1) / kv,
            "linear_proj's " + std::to_string(proj.at(1)) + " input columns are " + std::to_string(proj.at(1) / kv) +
                " heads of " + std::to_string(kv) + " channels");
    const bool gqa = bool_entry(args, "group_query_attention");
    const int64_t groups = gqa ? int_entry(args, "num_query_groups", -1) : heads;
    const int64_t kv_rows = qkv.at(0) - proj.at(1);
    c.field(gqa ? "num_query_groups" : "group_query_attention", kv_rows == 2 * groups * kv,
            "linear_qkv's " + std::to_string(qkv.at(0)) + " rows hold " +
                (kv_rows % (2 * kv) ? std::to_string(kv_rows) + " key and value rows"
                                    : std::to_string(kv_rows / (2 * kv)) + " query groups") +
                " of " + std::to_string(kv) + " channels (args.kv_channels, else hidden_size / num_attention_heads " +
                std::to_string(heads) + ")");
  }
  const auto& fc2 = c.need(l0 + "mlp.linear_fc2.weight");
  const int64_t ffn = fc2.at(1);
  c.field("ffn_hidden_size", int_entry(args, "ffn_hidden_size", -1) == ffn,
          "linear_fc2 has " + std::to_string(ffn) + " input columns");
  const int64_t fc1_rows = c.need(l0 + "mlp.linear_fc1.weight").at(0);
  c.field("swiglu", bool_entry(args, "swiglu") == (fc1_rows == 2 * ffn),
          "linear_fc1 has " + std::to_string(fc1_rows) + " rows for an ffn of " + std::to_string(ffn) +
              (fc1_rows == 2 * ffn ? " ([gate; up])" : ""));
  const bool untied = c.has("output_layer.weight");
  c.field("untie_embeddings_and_output_weights", bool_entry(args, "untie_embeddings_and_output_weights") == untied,
          untied ? "the folder holds an output layer of its own" : "the folder holds no output layer (tied)");
  const bool bias = c.has(l0 + "self_attention.linear_proj.bias");
  c.field("add_bias_linear", bool_entry(args, "add_bias_linear") == bias,
          std::string("linear_proj ") + (bias ? "has" : "has no") + " bias");
  const bool qkv_bias = c.has(l0 + "self_attention.linear_qkv.bias");
  c.field("add_qkv_bias", (bool_entry(args, "add_bias_linear") || bool_entry(args, "add_qkv_bias")) == qkv_bias,
          std::string("linear_qkv ") + (qkv_bias ? "has" : "has no") + " bias");
  const std::string norm_bias =
      local_spec ? l0 + "input_layernorm.bias" : l0 + "self_attention.linear_qkv.layer_norm_bias";
  const bool layer_norm = c.has(norm_bias);
  c.field("normalization", (str_entry(args, "normalization") == "LayerNorm") == layer_norm,
          layer_norm ? "its layer norms have biases (LayerNorm)" : "its layer norms have no bias (RMSNorm)");
  const bool learned = c.has("embedding.position_embeddings.weight");
  c.field("position_embedding_type", (str_entry(args, "position_embedding_type") == "learned_absolute") == learned,
          learned ? "the folder holds learned position embeddings" : "the folder holds no position embeddings");
  const bool qk_norm = c.has(l0 + "self_attention.q_layernorm.weight");
  c.field("qk_layernorm", bool_entry(args, "qk_layernorm") == qk_norm,
          std::string("the folder ") + (qk_norm ? "holds" : "holds no") + " q_layernorm");
  ValuePtr experts = args->get("num_experts");
  c.field("num_experts", !experts || experts->is(Kind::kNone),
          "a legacy checkpoint of a mixture of experts is not written (the folder is written dense only)");
  // The vocabulary. A map padded the rows from the config's vocab_size:
  // that against the job's own size where its args keep it, else against
  // its padded size at its own TP. A folder in megatron's names holds the
  // rows its job padded: those against padded_vocab_size.
  if (!hf_vocab) {
    c.field("padded_vocab_size", int_entry(args, "padded_vocab_size", -1) == embedding.at(0),
            "the folder's word embeddings have " + std::to_string(embedding.at(0)) + " rows");
  } else {
    const int64_t vocab = int_entry(args, "vocab_size", -1);
    const int64_t job_tp = int_entry(args, "tensor_model_parallel_size", 1);
    const int64_t divisible = int_entry(args, "make_vocab_size_divisible_by", 128);
    if (vocab > 0)
      c.field("vocab_size", vocab == hf_vocab->rows, hf_vocab->from + " is " + std::to_string(hf_vocab->rows));
    else
      c.field("padded_vocab_size",
              int_entry(args, "padded_vocab_size", -1) == padded_vocab(hf_vocab->rows, divisible, job_tp),
              hf_vocab->from + " is " + std::to_string(hf_vocab->rows) + ", padded to " +
                  std::to_string(padded_vocab(hf_vocab->rows, divisible, job_tp)) + " at the job's TP " +
                  std::to_string(job_tp));
  }
  c.finish();
}

// `args` (a Namespace, or its dict) copied with `key` set where it has it.
ValuePtr args_copy(const ValuePtr& args) {
  auto out = std::make_shared<Value>(*args);
  if (out->is(Kind::kBuilt) && out->object) out->object = std::make_shared<Value>(*out->object);
  return out;
}

}  // namespace

LegacySource legacy_source_of_hf(const CheckpointModel& hf, const CheckpointModel& job,
                                 const std::optional<HfVocab>& hf_vocab) {
  ValuePtr args = args_copy(megatron_lm_args(job));
  ValuePtr fields = mapping_of(args);
  ValuePtr impl = fields->get("transformer_impl");
  const std::string spec = impl && impl->is(Kind::kStr) ? impl->as_str() : "";
  if (spec != "local" && spec != "transformer_engine")
    fail(ErrorCode::kUnimplemented, "--args-from " + job.source + ": args.transformer_impl is " +
                                        (impl ? impl->repr() : std::string("absent")) +
                                        "; the names of megatron-core's local and transformer_engine GPT layer "
                                        "specs are known");
  const bool local_spec = spec == "local";
  ValuePtr root = mapping_of(hf.root);
  if (!root || !root->is(Kind::kDict)) fail(ErrorCode::kUnimplemented, hf.source + ": not a state dict of names");
  ValuePtr model = module_names(root, local_spec, hf.source);
  check_args_against_model(hf, model, fields, job.source, hf_vocab, local_spec);
  // The local spec's ColumnParallelLinear keeps a None extra state that
  // load_state_dict(strict=True) wants (a folder holds none).
  if (!model->get("output_layer._extra_state") && local_spec)
    model->entries.emplace_back(Value::str("output_layer._extra_state"), Value::none());
  // The rows the model holds are the source's padded vocabulary; a job
  // converted from a Hugging Face model has consumed no samples
  // (Megatron-LM's loader_llama_mistral sets 0, saver_legacy keeps it).
  const auto rows = tensor_ref_index(*model->at("embedding.word_embeddings.weight"));
  if (!rows) fail(ErrorCode::kUnimplemented, hf.source + ": embedding.word_embeddings.weight is not a tensor");
  set_existing(fields, "padded_vocab_size", Value::integer(hf.tensors.at(*rows).shape.at(0)));
  set_existing(fields, "consumed_train_samples", Value::integer(0));
  set_existing(fields, "consumed_valid_samples", Value::integer(0));
  LegacySource out;
  out.model = hf;
  out.model.facts[kArgsFromFact] = job.source;
  ValuePtr job_root = mapping_of(job.root);
  ValuePtr version = job_root->get("checkpoint_version");
  // Megatron-LM's converter saves at iteration 1 ("'0', 'release' don't
  // work", loader_llama_mistral) with no floating-point operations so far.
  out.model.root = Value::dict({{Value::str("args"), args},
                                {Value::str("checkpoint_version"), version ? version : Value::floating(3.0)},
                                {Value::str("iteration"), Value::integer(1)},
                                {Value::str("model"), model},
                                {Value::str("num_floating_point_operations_so_far"), Value::integer(0)}});
  return out;
}

LegacyOutput plan_legacy_output(const CheckpointModel& legacy, const CheckpointModel* optim, int tp, int pp,
                                std::optional<bool> distributed, int vpp) {
  if (tp < 1 || pp < 1 || vpp < 1)
    fail_invalid("--tp, --pp and --vpp must be at least 1 (got " + std::to_string(tp) + ", " + std::to_string(pp) +
                 " and " + std::to_string(vpp) + ")");
  return LegacyPlanner(legacy, optim, tp, pp, distributed, vpp).run();
}

}  // namespace ckpt::megatron_legacy
