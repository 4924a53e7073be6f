// Which optimizer state belongs to which parameter in Megatron-LM's legacy
// (ckpt_format=torch) files (docs/megatron.md, "The optimizer"). Neither
// file names the parameters: the place of each is fixed by the parameter
// order of the rank's model and by rules of the megatron-core version that
// wrote it. The rules here are megatron-core 0.16's, read off its source:
//
//   distrib_optim.pt (DistributedOptimizer.get_parameter_state_dp_zero):
//     per grad buffer (gbuf index: model chunk by model chunk, within a chunk
//     one buffer per (param dtype, grad dtype) in the order those first
//     appear among its parameters), flat fp32 `param` (the fp32 master),
//     `exp_avg`, `exp_avg_sq` of `numel_unpadded` elements, DP shards
//     gathered. _ParamAndGradBuffer lays a buffer's parameters out in reverse
//     registration order, each starting at a multiple of 64 elements, and
//     closes a bucket after the parameter that brings it to `bucket_size`
//     elements (when there is a bucket size: overlap_grad_reduce, pipeline
//     rank 0, the first chunk); the end of a bucket is padded to a multiple
//     of lcm(DP, 128). The world tensors keep the padding between
//     parameters and drop each bucket's end padding, so a bucket's
//     parameters start right after the previous bucket's last one, aligned
//     within their bucket. A tied embedding's copy at PP > 1 (the first
//     stage's word embeddings, the last stage's output layer:
//     `shared_embedding`) gets a bucket of its own: the bucket before it is
//     closed at its (aligned) start, and its own right after it.
//   model_optim_rng.pt `optimizer` of the plain optimizer (torch Adam's
//     state_dict, indices numbered over the param groups in order; under
//     fp16/bf16 wrapped as {"optimizer": that, "fp32_from_fp16_params": the
//     fp32 masters of each group's 16-bit parameters in order}):
//     _get_param_groups puts a chunk's parameters, chunk after chunk, into
//     the default group (weight decay) first, then the wd_mult=0 group of
//     biases and 1-d parameters (the standard overrides without
//     decoupled_lr or apply_wd_to_qk_layernorm).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/checkpoint_model.h"
#include "pickle/value.h"

namespace ckpt::megatron_legacy {

// A parameter of one model chunk, as the rank's model state dict lists it
// (registration order: what named_parameters gives).
struct LocalParam {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  bool shared_embedding = false;  // a tied embedding's copy at PP > 1: a bucket of its own
  uint64_t numel() const { return shape_numel(shape); }
};

// One grad buffer of distrib_optim.pt and where its parameters lie in it.
struct FlatBuffer {
  std::size_t chunk = 0;  // model chunk (virtual stage) it belongs to
  DType param_dtype = DType::kFloat32, grad_dtype = DType::kFloat32;
  uint64_t numel_unpadded = 0;  // what the file must record
  struct Place {
    std::size_t param = 0;  // index into the chunk's parameters
    uint64_t start = 0;     // first element in the buffer's world tensors
  };
  std::vector<Place> places;
};

// The grad buffers megatron-core 0.16 builds for these chunks, in gbuf
// index order. `grad_in_fp32`: args.accumulate_allreduce_grads_in_fp32 (the
// grad dtype is then float32). `bucket_size[c]`: chunk c's bucket size in
// elements, 0 for one bucket (no bucketing).
std::vector<FlatBuffer> distopt_buffers_v016(const std::vector<std::vector<LocalParam>>& chunks, bool grad_in_fp32,
                                             const std::vector<uint64_t>& bucket_size);

// The job's args that select a rank's distrib_optim.pt layout: what
// Megatron-LM's get_model gives megatron-core 0.16's DistributedDataParallel.
struct DistoptArgs {
  bool grad_in_fp32 = false;  // accumulate_allreduce_grads_in_fp32
  bool tied = false;          // not untie_embeddings_and_output_weights
  bool overlap_grad_reduce = false;
  bool overlap_param_gather_with_optimizer_step = false;
  int64_t ddp_num_buckets = 0;
  std::optional<int64_t> ddp_bucket_size;
  int64_t dp = 1, cp = 1;  // data_parallel_size, context_parallel_size
};

// Read from a job's args (the Namespace's attributes); absent ones take
// Megatron-LM's defaults.
DistoptArgs distopt_args_v016(const pickle::Value& args);

// The grad buffers of the rank at pipeline rank `pp_rank` of `pp_size`
// holding `chunks` (their parameters as the rank's model lists them, under
// the rank's own names): the tied embedding's copies marked
// shared_embedding, each chunk's bucket size from `args`, then
// distopt_buffers_v016. The one place reading and writing distrib_optim.pt
// take the layout from.
std::vector<FlatBuffer> distopt_rank_buffers_v016(std::vector<std::vector<LocalParam>>& chunks, const DistoptArgs& args,
                                                  int pp_rank, int pp_size);

// Whether megatron-core 0.16's standard overrides exempt `p` from weight
// decay (its "*.bias" name glob or a 1-d shape).
bool no_weight_decay_v016(const LocalParam& p);

}  // namespace ckpt::megatron_legacy
