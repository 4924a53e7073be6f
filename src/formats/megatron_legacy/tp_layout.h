// How Megatron-LM's legacy (ckpt_format=torch) files split a model over
// tensor and pipeline parallelism (docs/megatron.md, "Legacy checkpoints").
// None of it is stored: each rank's file holds its own piece under the
// module's own name. The rules come from the layer kinds megatron-core
// defines (megatron/core/tensor_parallel/layers.py):
//
//   VocabParallelEmbedding   word_embeddings        split on dim 0 (vocab rows)
//   ColumnParallelLinear     linear_qkv, linear_fc1,
//                            output_layer           weight and bias split on dim 0
//   RowParallelLinear        linear_proj, linear_fc2 weight split on dim 1,
//                                                    bias whole on every rank
//   the rest (layer norms, position_embeddings)     whole on every rank
//
// Two column-parallel layers hold more than one matrix:
//   - linear_qkv rows are grouped per query group, [q (heads per group x
//     head dim); k; v], and each TP rank holds whole groups: the TP=1 tensor
//     is the ranks' pieces in rank order (plain dim-0 concatenation).
//   - with SwiGLU (args.swiglu) linear_fc1 on rank r is [gate_r; up_r]; the
//     TP=1 tensor is [gate_0 .. gate_{T-1}; up_0 .. up_{T-1}].
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ckpt::megatron_legacy {

enum class TpSplit {
  kWhole,       // every TP rank holds the whole tensor (checked equal)
  kDim0,        // concatenated on dim 0 in TP rank order
  kDim1,        // concatenated on dim 1 in TP rank order
  kGatedDim0,   // SwiGLU linear_fc1: each rank's [gate_r; up_r] halves
  kExtraState,  // a module's _extra_state object: TP rank 0's
};

const char* tp_split_name(TpSplit split);

// The split of the model entry `name` (its module's kind is the last but
// one component: "decoder.layers.3.mlp.linear_fc1.weight" -> linear_fc1);
// nullopt for a name the rules above do not cover (the reader refuses it
// rather than guess a dimension).
std::optional<TpSplit> tp_split_of(const std::string& name, bool swiglu);

// A rank folder's name, mp_rank_<tp:02d>[_<pp:03d>][_<ep:03d>]
// (checkpointing.py get_checkpoint_name), as its numbers; nullopt when it
// is not one. Which of two suffixes is the pipeline rank and which the
// expert rank is not in the name: the job's args say (see RankFolder).
struct RankFolderName {
  int tp = 0;
  std::optional<int> second, third;
};
std::optional<RankFolderName> parse_rank_folder(const std::string& name);

// The folder name Megatron-LM gives the rank (tp, pp, ep) of a job with
// these pipeline and expert parallel sizes.
std::string rank_folder_name(int tp, int pp, int ep, int pp_size, int ep_size);

// "decoder.layers.<i>.<rest>": the place of <i> in `name` (the first
// component `layers` followed by a number) as {start, length}; nullopt when
// the name has none.
struct LayerIndexAt {
  std::size_t pos = 0, len = 0;
  int64_t index = 0;
};
std::optional<LayerIndexAt> layer_index_in(const std::string& name);

// The layer spec's sharded_state_dict_keys_map (megatron-core's
// models/gpt/gpt_layer_specs.py): the local spec stores its layer norms
// under the linear layer they feed, where Transformer Engine fuses them,
// so a torch_dist checkpoint loads into either spec. `rest`: a layer's
// entry name after "layers.<i>."; `local_spec`: args.transformer_impl is
// "local" (Transformer Engine's names are stored as they are).
//   stored_layer_name  the module's name -> the stored one
//                      (input_layernorm.weight -> self_attention.linear_qkv.layer_norm_weight)
//   module_layer_name  the stored name -> the module's (its inverse)
std::string stored_layer_name(const std::string& rest, bool local_spec);
std::string module_layer_name(const std::string& rest, bool local_spec);

}  // namespace ckpt::megatron_legacy
