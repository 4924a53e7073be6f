#include "formats/megatron_legacy/optim_layout.h"

#include <map>
#include <utility>

namespace ckpt::megatron_legacy {
namespace {

// _ParamAndGradBuffer._pad_start_of_param_if_needed under the distributed
// optimizer: parameters start 128-byte aligned (64 values of >= 16 bits).
constexpr uint64_t kParamAlign = 64;

uint64_t pad_to(uint64_t n, uint64_t divisor) { return (n + divisor - 1) / divisor * divisor; }

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

bool no_weight_decay_v016(const LocalParam& p) {
  const std::string tail = ".bias";
  const bool bias = p.name.size() >= tail.size() && p.name.compare(p.name.size() - tail.size(), tail.size(), tail) == 0;
  return bias || p.shape.size() == 1;
}

}  // namespace ckpt::megatron_legacy
