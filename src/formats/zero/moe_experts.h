// DeepSpeed MoE checkpoints (deepspeed.moe.layer.MoE) at ZeRO-1/2, as
// DeepSpeed 0.19.8 writes them (docs/deepspeed.md, "MoE"):
//
//   layer_L_expert_E_mp_rank_00_model_states.pt   one per expert E (global id) of MoE layer L (the L-th MoE
//                                                 module in named_modules order), written by expert-data-parallel
//                                                 rank 0 of the expert's expert-parallel rank: its lp state dict,
//                                                 keys named with the global id
//                                                 ("moe.deepspeed_moe.experts.deepspeed_experts.E.weight")
//   mp_rank_00_model_states.pt                    `module` without the experts; param_shapes with one group per
//                                                 optimizer group, the expert group's names local
//                                                 (deepspeed_experts.0 .. num_local-1); num_experts per layer
//   [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt
//                                                 ZeRO-1/2 partitions; an expert group's partition_count is the
//                                                 expert-data-parallel size W/ep, not W
//
// With DeepSpeed's default topology (groups._get_expert_parallel_ranks,
// use_data_before_expert_parallelism off) rank r has expert-parallel rank
// r % ep and expert-data-parallel rank r / ep: the ranks e, e+ep, e+2ep, ...
// hold, in that order, the partitions of one flat buffer of the local
// experts of expert-parallel rank e, whose global ids are
// e * num_local + local id.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "formats/zero/zero_files.h"

namespace ckpt::zero {

// "a.deepspeed_experts.3.weight" -> {"a.deepspeed_experts.", 3, ".weight"}.
struct ExpertName {
  std::string prefix;
  int id = 0;
  std::string rest;
  std::string with_id(int global_id) const { return prefix + std::to_string(global_id) + rest; }
};
std::optional<ExpertName> parse_expert_name(const std::string& name);

// The ranks of expert-parallel rank e's expert-data-parallel group, in
// partition order: e, e + ep, ..., below world.
std::vector<int> expert_data_parallel_ranks(int e, int ep, int world);

// "layer_0_expert_3_mp_rank_00_model_states.pt".
std::string expert_file_name(int layer, int expert);

// `module` (the model-states file's, without experts) with the expert
// entries placed where the model has them: after the last entry of their
// MoE layer's module ("moe.deepspeed_moe." for
// "moe.deepspeed_moe.experts.deepspeed_experts.0.weight": the gate), or at
// the end when no entry shares it.
std::vector<ModuleEntry> with_experts(std::vector<ModuleEntry> module, const std::vector<ModuleEntry>& experts);

}  // namespace ckpt::zero
