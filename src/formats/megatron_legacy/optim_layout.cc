#include "formats/megatron_legacy/optim_layout.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <utility>

namespace ckpt::megatron_legacy {
namespace {

// _ParamAndGradBuffer._pad_start_of_param_if_needed under the distributed
// optimizer: parameters start 128-byte aligned (64 values of >= 16 bits).
constexpr uint64_t kParamAlign = 64;

uint64_t pad_to(uint64_t n, uint64_t divisor) { return (n + divisor - 1) / divisor * divisor; }

using pickle::Kind;

bool bool_of(const pickle::Value& args, std::string_view key) {
  pickle::ValuePtr v = args.get(key);
  return v && v->is(Kind::kBool) && v->as_bool();
}

std::optional<int64_t> int_of(const pickle::Value& args, std::string_view key) {
  pickle::ValuePtr v = args.get(key);
  if (v && v->is(Kind::kInt)) return v->int_value;
  return std::nullopt;
}

// Each chunk's grad-buffer bucket size in elements (0: one bucket), as
// Megatron-LM's get_model and megatron-core 0.16's DistributedDataParallel
// set it: only with overlap_grad_reduce, only on pipeline rank 0 and for
// the first chunk (bucketing is disabled for the others, and everywhere
// under overlap_param_gather_with_optimizer_step); ddp_num_buckets splits
// the rank's parameters evenly, else ddp_bucket_size, else
// max(40M, 1M x DP x CP).
std::vector<uint64_t> bucket_sizes(const std::vector<std::vector<LocalParam>>& chunks, const DistoptArgs& a,
                                   int pp_rank) {
  std::vector<uint64_t> out(chunks.size(), 0);
  if (chunks.empty() || !a.overlap_grad_reduce || a.overlap_param_gather_with_optimizer_step || pp_rank > 0) return out;
  int64_t size = 0;
  if (a.ddp_num_buckets > 0) {
    uint64_t total = 0;
    for (const auto& chunk : chunks)
      for (const LocalParam& p : chunk) total += p.numel();
    size = static_cast<int64_t>(total / static_cast<uint64_t>(a.ddp_num_buckets));
  } else if (a.ddp_bucket_size) {
    size = *a.ddp_bucket_size;
  } else {
    size = std::max<int64_t>(40000000, 1000000 * a.dp * a.cp);
  }
  // A size of 0 closes a bucket after every parameter, as 1 does.
  out[0] = static_cast<uint64_t>(std::max<int64_t>(size, 1));
  return out;
}

}  // namespace

std::vector<FlatBuffer> distopt_buffers_v016(const std::vector<std::vector<LocalParam>>& chunks, bool grad_in_fp32,
                                             const std::vector<uint64_t>& bucket_size) {
  std::vector<FlatBuffer> out;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    // DistributedDataParallel: one buffer per (param dtype, grad dtype), in
    // the order the pairs first appear among the chunk's parameters.
    std::vector<std::pair<DType, std::vector<std::size_t>>> by_dtype;
    for (std::size_t i = 0; i < chunks[c].size(); ++i) {
      const DType d = chunks[c][i].dtype;
      auto it = by_dtype.begin();
      while (it != by_dtype.end() && it->first != d) ++it;
      if (it == by_dtype.end()) it = by_dtype.insert(by_dtype.end(), {d, {}});
      it->second.push_back(i);
    }
    for (const auto& [dtype, members] : by_dtype) {
      FlatBuffer b;
      b.chunk = c;
      b.param_dtype = dtype;
      b.grad_dtype = grad_in_fp32 ? DType::kFloat32 : dtype;
      // In the saved (unpadded) coordinates: `bucket` is where the current
      // bucket starts, `end` where its last parameter ends. Buckets start at
      // multiples of lcm(DP, 128), so alignment within a bucket is alignment.
      const uint64_t size = c < bucket_size.size() ? bucket_size[c] : 0;
      uint64_t bucket = 0, end = 0;
      bool bucket_has_params = false;
      for (auto it = members.rbegin(); it != members.rend(); ++it) {  // reverse: roughly backprop order
        const LocalParam& p = chunks[c][*it];
        uint64_t start = bucket + pad_to(end - bucket, kParamAlign);
        if (p.shared_embedding && bucket_has_params) bucket = start;  // close the bucket before it
        b.places.push_back({*it, start});
        end = start + p.numel();
        bucket_has_params = true;
        if ((size > 0 && end - bucket >= size) || p.shared_embedding) {  // full, or the shared embedding's own
          bucket = end;
          bucket_has_params = false;
        }
      }
      b.numel_unpadded = end;
      out.push_back(std::move(b));
    }
  }
  return out;
}

DistoptArgs distopt_args_v016(const pickle::Value& args) {
  DistoptArgs a;
  a.grad_in_fp32 = bool_of(args, "accumulate_allreduce_grads_in_fp32");
  a.tied = !bool_of(args, "untie_embeddings_and_output_weights");
  a.overlap_grad_reduce = bool_of(args, "overlap_grad_reduce");
  a.overlap_param_gather_with_optimizer_step = bool_of(args, "overlap_param_gather_with_optimizer_step");
  a.ddp_num_buckets = int_of(args, "ddp_num_buckets").value_or(0);
  a.ddp_bucket_size = int_of(args, "ddp_bucket_size");
  a.dp = int_of(args, "data_parallel_size").value_or(1);
  a.cp = int_of(args, "context_parallel_size").value_or(1);
  return a;
}

std::vector<FlatBuffer> distopt_rank_buffers_v016(std::vector<std::vector<LocalParam>>& chunks, const DistoptArgs& args,
                                                  int pp_rank, int pp_size) {
  // LanguageModule: with tied embeddings at PP > 1, the first stage's word
  // embeddings and the last stage's output layer (the copy) are the
  // shared embedding (each exists only on its stage).
  if (args.tied && pp_size > 1)
    for (auto& chunk : chunks)
      for (LocalParam& p : chunk)
        p.shared_embedding = p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight";
  return distopt_buffers_v016(chunks, args.grad_in_fp32, bucket_sizes(chunks, args, pp_rank));
}

bool no_weight_decay_v016(const LocalParam& p) {
  const std::string tail = ".bias";
  const bool bias = p.name.size() >= tail.size() && p.name.compare(p.name.size() - tail.size(), tail.size(), tail) == 0;
  return bias || p.shape.size() == 1;
}

}  // namespace ckpt::megatron_legacy
