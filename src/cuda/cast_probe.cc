#include "cuda/cast_probe.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/cast_rules.h"
#include "core/dtype.h"
#include "torch_plugin/torch_cast.h"

namespace ckpt::cuda {
namespace {

std::vector<uint32_t> float32_probes() {
  std::vector<uint32_t> v;
  // Every exponent with mantissas at and around both targets' halfway points
  // (bfloat16 drops 16 bits, half 13), plus zero, Inf, extremes.
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 0; e < 255; ++e)
      for (uint32_t m : {0u, 1u, 0x0FFFu, 0x1000u, 0x1001u, 0x3000u, 0x7FFFu, 0x8000u, 0x8001u, 0x18000u, 0x7FFFFFu,
                         0x7FF000u, 0x7FE000u, 0x400000u})
        v.push_back(sign | (e << 23) | m);
  v.push_back(0x7F800000u);
  v.push_back(0xFF800000u);
  uint64_t x = 0x9E3779B97F4A7C15ull;  // xorshift: a reproducible spread over all patterns
  for (int i = 0; i < (1 << 20); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v.push_back(static_cast<uint32_t>(x));
  }
  std::erase_if(v, [](uint32_t u) { return f32_is_nan(u); });
  return v;
}

template <typename In, typename Out, typename Rule, typename IsNan>
std::string compare(const std::vector<In>& in, int from, int to, int threads, Rule rule, IsNan is_nan) {
  std::vector<Out> host(in.size());
  if (const char* err = torch_cast(in.data(), from, host.data(), to, in.size(), threads))
    return std::string("host cast failed: ") + err;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (is_nan(in[i]) || rule(in[i]) == host[i]) continue;
    char msg[160];
    std::snprintf(msg, sizeof msg, "input 0x%llx: LibTorch CPU gives 0x%llx, the device rule 0x%llx",
                  static_cast<unsigned long long>(in[i]), static_cast<unsigned long long>(host[i]),
                  static_cast<unsigned long long>(rule(in[i])));
    return msg;
  }
  return {};
}

std::vector<uint16_t> all_16bit() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

}  // namespace

std::string probe_cast_rule(int from, int to, int threads) {
  DType f = static_cast<DType>(from), t = static_cast<DType>(to);
  if (f == DType::kFloat32 && t == DType::kBFloat16)
    return compare<uint32_t, uint16_t>(float32_probes(), from, to, threads, f32_to_bf16, f32_is_nan);
  if (f == DType::kFloat32 && t == DType::kFloat16)
    return compare<uint32_t, uint16_t>(float32_probes(), from, to, threads, f32_to_f16, f32_is_nan);
  if (f == DType::kBFloat16 && t == DType::kFloat32)
    return compare<uint16_t, uint32_t>(all_16bit(), from, to, threads, bf16_to_f32, bf16_is_nan);
  if (f == DType::kFloat16 && t == DType::kFloat32)
    return compare<uint16_t, uint32_t>(all_16bit(), from, to, threads, f16_to_f32, f16_is_nan);
  return "no device kernel for this pair";
}

}  // namespace ckpt::cuda
