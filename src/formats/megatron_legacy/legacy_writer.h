// What `reshard SRC --layout megatron-legacy --tp T --pp P` writes
// (docs/megatron.md, "Writing legacy checkpoints"): a Megatron-LM
// ckpt_format=torch checkpoint for a job at TP T x PP P,
//
//   latest_checkpointed_iteration.txt           the iteration, or "release"
//   iter_<N:07d>/ (or release/)
//       mp_rank_<tp:02d>[_<pp:03d>]/model_optim_rng.pt
//
// from a legacy checkpoint or a Megatron-LM job's torch_dist one (its args
// in common.pt: legacy_source_of_torch_dist below), or a Hugging Face
// folder with a job's args from another checkpoint (legacy_source_of_hf), with V virtual
// pipeline stages per rank (model0..model<V-1>) where asked;
// each rank file a dict of the source's job entries (args with the new
// parallel sizes, checkpoint_version, iteration, ...) and `model`, the
// rank's piece of the TP=1/PP=1 model the legacy reader gives: the inverse
// of tp_layout.h (column-parallel rows, row-parallel columns, vocab rows,
// SwiGLU linear_fc1 as this rank's [gate_r; up_r]) and of the pipeline
// renumbering (stage p holds layers [p L/P, (p+1) L/P), numbered from 0).
// With the source's optimizer state per parameter name (the reader's
// --only optim view), each rank file also holds `optimizer` as megatron-
// core's plain optimizer saves it for that rank's model: torch Adam's
// state_dict, its state indexed in the order of megatron-core 0.16's
// _get_param_groups (the source's groups in order, each holding the rank's
// parameters its rule selects), every state the rank's TP piece of the
// parameter's; under fp16/bf16 wrapped as Float16OptimizerWithFloat16Params
// saves it, with the fp32 masters in fp32_from_fp16_params. A source that
// used the distributed optimizer (args.use_distributed_optimizer) gets it
// again: each rank file's `optimizer` holds what DistributedOptimizer.
// state_dict gives (the param groups with the step, no state), and beside
// it distrib_optim.pt holds what save_parameter_state writes for the rank's
// model (optim_layout.h: flat fp32 buffers of masters and Adam moments,
// laid out by the source's args). The RNG states are not written (seeded
// per TP x PP position; the job loads with --no-load-rng).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt::megatron_legacy {

// One rank's model_optim_rng.pt: its state dict, whose tensor references
// index `tensors`, each a piece of a tensor of the model read (chunks into
// its files: nothing is read to plan).
struct LegacyRankFile {
  std::string name;  // "iter_0000007/mp_rank_01_000/model_optim_rng.pt", or its distrib_optim.pt
  pickle::ValuePtr root;
  std::vector<TensorEntry> tensors;
};

struct LegacyOutput {
  std::string tracker;  // latest_checkpointed_iteration.txt: "7", or "release"
  // PP rank after PP rank, TP rank after TP rank; each rank's distrib_optim.pt right after its rank file
  std::vector<LegacyRankFile> files;
};

// A Megatron-LM job's torch_dist checkpoint as plan_legacy_output takes a
// legacy one: `whole` read whole (common.pt's entries at the top: args,
// iteration, ...), `read_views` reading the same directory with --only
// optim (or --only model where its optimizer is not read: no optim then),
// called once the args are found. The model
// is the --only model view under the module's own names (the layer spec's
// keys map backwards, as args.transformer_impl says) with
// output_layer._extra_state (None, which GPTModel.sharded_state_dict leaves
// out of the save) put back; the job's entries are common.pt's but the
// optimizer's param groups, which the optimizer view carries. Unimplemented
// (exit 3) naming what is missing where the args a legacy rank file needs
// are not there (a torch_dist checkpoint megatron-core saved without
// Megatron-LM's common state): they are never made up.
struct LegacySource {
  CheckpointModel model;                 // root {args, checkpoint_version, iteration, model, ...}
  std::optional<CheckpointModel> optim;  // root {"optim": {"state": {name: ...}, "param_groups": [...]}}
};
LegacySource legacy_source_of_torch_dist(const CheckpointModel& whole,
                                         const std::function<CheckpointModel()>& read_views);

// The fact a source made by legacy_source_of_hf carries: where its args came from.
inline constexpr const char* kArgsFromFact = "megatron args from";

// The Megatron-LM args of `job` (a legacy checkpoint or a Megatron-LM job's
// torch_dist one, read whole: args at the top of its root), for --args-from;
// Unimplemented (exit 3) where it holds none, naming it.
pickle::ValuePtr megatron_lm_args(const CheckpointModel& job);

// The multiple a Hugging Face folder's vocabulary is padded to for a job
// with `args` at TP `tp`: Megatron-LM's make_vocab_size_divisible_by x TP.
int64_t vocab_multiple(const pickle::ValuePtr& args, int tp);

// `reshard HF --layout megatron-legacy --args-from JOB`: a Hugging Face
// folder's model, mapped back to megatron-core's names (or already in
// them), as plan_legacy_output takes a legacy source: the module's own
// names (the keys map backwards, as args.transformer_impl says), JOB's
// args (consumed samples 0, padded_vocab_size the rows the model holds),
// its checkpoint_version, iteration 1 and no floating-point operations so
// far, as Megatron-LM's converter (tools/checkpoint, saver_legacy) writes a
// converted model; no optimizer. Every field the layout depends on is
// checked against the tensors first: Unimplemented (exit 3) naming the
// field, its value in JOB's args and what the folder says. `hf_vocab`: the
// config's vocab_size where a map padded the rows (checked against
// args.vocab_size); absent, the folder's rows are the job's padded ones
// (checked against args.padded_vocab_size).
struct HfVocab {
  int64_t rows = 0;
  std::string from;  // "config.json's vocab_size"
};
LegacySource legacy_source_of_hf(const CheckpointModel& hf, const CheckpointModel& job,
                                 const std::optional<HfVocab>& hf_vocab);

// `legacy`: a Megatron-LM legacy checkpoint read whole (the model at
// TP=1/PP=1 and the job's args), or a torch_dist one made so by
// legacy_source_of_torch_dist; InvalidArgument for another source or
// one read with --only, Unimplemented (exit 3) naming what does not split:
// layers that do not divide by PP, a TP-split dimension, query groups or
// the padded vocabulary that do not divide by TP, a parameter tp_layout.h
// does not know. Tied embeddings: the last stage's copy of the word
// embeddings (output_layer.weight) is written at PP > 1 and left out at
// PP = 1. `vpp` > 1: V virtual pipeline stages per pipeline rank, each
// rank file's model0..model<V-1> (virtual stage v of pipeline rank p the
// (v P + p)-th run of L/(V P) layers, numbered from 0 in each; the
// embeddings model0's of stage 0, the final norm and output layer
// model<V-1>'s of stage P-1), args' virtual-pipeline sizes V. `optim`: the same
// checkpoint read with --only optim, or nullptr to write no optimizer;
// its state must name every parameter the ranks hold (DataLoss naming the
// one it lacks). `distributed`: the optimizer written as the
// DistributedOptimizer's (true) or the plain one's (false); absent: as the
// source's args.use_distributed_optimizer says.
LegacyOutput plan_legacy_output(const CheckpointModel& legacy, const CheckpointModel* optim, int tp, int pp,
                                std::optional<bool> distributed = std::nullopt, int vpp = 1);

}  // namespace ckpt::megatron_legacy
