// The CUDA backend's kernels: fused cast + NaN/Inf count, and the count
// alone, with the bit rules of exec/finite_scan.cc and the conversions of
// core/cast_rules.h. Each thread walks the range with a grid stride and
// keeps its counts in registers; a warp adds them up with shuffles and one
// lane per warp adds them to the piece's counters.
#include "cuda/kernels.h"

#include "core/cast_rules.h"
#include "core/dtype.h"

namespace ckpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

// Element classes as in exec/finite_scan.cc: 0 finite, 1 Inf, 2 NaN.
template <typename B, B kExp, B kMant>
struct Ieee {
  using Bits = B;
  __device__ static int classify(B b) {
    if ((b & kExp) != kExp) return 0;
    return (b & kMant) ? 2 : 1;
  }
};
// Float8 formats without Inf: NaN is one or two exact bit patterns.
template <uint8_t kMask, uint8_t kPattern>
struct NanPattern {
  using Bits = uint8_t;
  __device__ static int classify(uint8_t b) { return (b & kMask) == kPattern ? 2 : 0; }
};

using F64 = Ieee<unsigned long long, 0x7FF0000000000000ull, 0x000FFFFFFFFFFFFFull>;
using F32 = Ieee<uint32_t, 0x7F800000u, 0x007FFFFFu>;
using F16 = Ieee<uint16_t, 0x7C00u, 0x03FFu>;
using BF16 = Ieee<uint16_t, 0x7F80u, 0x007Fu>;
using E5M2 = Ieee<uint8_t, 0x7C, 0x03>;
using E4M3FN = NanPattern<0x7F, 0x7F>;  // S.1111.111
using FNUZ = NanPattern<0xFF, 0x80>;    // the negative-zero pattern
using E8M0 = NanPattern<0xFF, 0xFF>;

__device__ void add_counts(PieceCounts* counts, unsigned long long in_nan, unsigned long long nan,
                           unsigned long long inf) {
  for (int offset = 16; offset > 0; offset /= 2) {
    in_nan += __shfl_down_sync(0xFFFFFFFFu, in_nan, offset);
    nan += __shfl_down_sync(0xFFFFFFFFu, nan, offset);
    inf += __shfl_down_sync(0xFFFFFFFFu, inf, offset);
  }
  if ((threadIdx.x & 31) != 0) return;
  if (in_nan) atomicAdd(&counts->in_nan, in_nan);
  if (nan) atomicAdd(&counts->out_nan, nan);
  if (inf) atomicAdd(&counts->out_inf, inf);
}

// `Parts` values of the rule make one element (2 for complex); an element
// is NaN when any part is, else Inf when any part is.
template <class Rule, int Parts>
__global__ void scan_kernel(const typename Rule::Bits* data, std::size_t n, PieceCounts* counts) {
  unsigned long long nan = 0, inf = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    int worst = 0;
    for (int k = 0; k < Parts; ++k) worst = max(worst, Rule::classify(data[i * Parts + k]));
    nan += worst == 2;
    inf += worst == 1;
  }
  add_counts(counts, 0, nan, inf);
}

struct F32ToBF16 {
  using In = uint32_t;
  using Out = uint16_t;
  using OutRule = BF16;
  __device__ static Out convert(In x) { return f32_to_bf16(x); }
  __device__ static bool in_nan(In x) { return f32_is_nan(x); }
};
struct F32ToF16 {
  using In = uint32_t;
  using Out = uint16_t;
  using OutRule = F16;
  __device__ static Out convert(In x) { return f32_to_f16(x); }
  __device__ static bool in_nan(In x) { return f32_is_nan(x); }
};
struct BF16ToF32 {
  using In = uint16_t;
  using Out = uint32_t;
  using OutRule = F32;
  __device__ static Out convert(In x) { return bf16_to_f32(x); }
  __device__ static bool in_nan(In x) { return bf16_is_nan(x); }
};
struct F16ToF32 {
  using In = uint16_t;
  using Out = uint32_t;
  using OutRule = F32;
  __device__ static Out convert(In x) { return f16_to_f32(x); }
  __device__ static bool in_nan(In x) { return f16_is_nan(x); }
};

template <class Conv>
__global__ void convert_kernel(const typename Conv::In* in, typename Conv::Out* out, std::size_t n, bool scan,
                               PieceCounts* counts) {
  unsigned long long in_nan = 0, nan = 0, inf = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    typename Conv::In x = in[i];
    typename Conv::Out y = Conv::convert(x);
    out[i] = y;
    in_nan += Conv::in_nan(x);
    if (scan) {
      int c = Conv::OutRule::classify(y);
      nan += c == 2;
      inf += c == 1;
    }
  }
  add_counts(counts, in_nan, nan, inf);
}

unsigned blocks_for(std::size_t n) {
  std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

template <class Conv>
cudaError_t launch_convert(const void* in, void* out, std::size_t n, bool scan, PieceCounts* counts,
                           cudaStream_t stream) {
  convert_kernel<Conv><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const typename Conv::In*>(in),
                                                               static_cast<typename Conv::Out*>(out), n, scan, counts);
  return cudaGetLastError();
}

template <class Rule, int Parts = 1>
cudaError_t launch_scan(const void* data, std::size_t n, PieceCounts* counts, cudaStream_t stream) {
  scan_kernel<Rule, Parts>
      <<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const typename Rule::Bits*>(data), n, counts);
  return cudaGetLastError();
}

DType as_dtype(int code) { return static_cast<DType>(code); }

}  // namespace

bool has_cast_kernel(int from, int to) {
  DType f = as_dtype(from), t = as_dtype(to);
  return (f == DType::kFloat32 && (t == DType::kBFloat16 || t == DType::kFloat16)) ||
         (t == DType::kFloat32 && (f == DType::kBFloat16 || f == DType::kFloat16));
}

bool has_scan_kernel(int dtype) {
  switch (as_dtype(dtype)) {
    case DType::kFloat64:
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kComplex32:
    case DType::kComplex64:
    case DType::kComplex128:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat8E8M0FNU:
    case DType::kFloat8E5M2: return true;
    default: return false;
  }
}

cudaError_t cast_and_count_async(const void* in, int from, void* out, int to, std::size_t n, bool scan,
                                 PieceCounts* counts, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  DType f = as_dtype(from), t = as_dtype(to);
  if (f == DType::kFloat32 && t == DType::kBFloat16) return launch_convert<F32ToBF16>(in, out, n, scan, counts, stream);
  if (f == DType::kFloat32 && t == DType::kFloat16) return launch_convert<F32ToF16>(in, out, n, scan, counts, stream);
  if (f == DType::kBFloat16 && t == DType::kFloat32) return launch_convert<BF16ToF32>(in, out, n, scan, counts, stream);
  if (f == DType::kFloat16 && t == DType::kFloat32) return launch_convert<F16ToF32>(in, out, n, scan, counts, stream);
  return cudaErrorInvalidValue;
}

cudaError_t count_nonfinite_async(const void* data, int dtype, std::size_t n, PieceCounts* counts,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (as_dtype(dtype)) {
    case DType::kFloat64: return launch_scan<F64>(data, n, counts, stream);
    case DType::kFloat32: return launch_scan<F32>(data, n, counts, stream);
    case DType::kFloat16: return launch_scan<F16>(data, n, counts, stream);
    case DType::kBFloat16: return launch_scan<BF16>(data, n, counts, stream);
    case DType::kComplex32: return launch_scan<F16, 2>(data, n, counts, stream);
    case DType::kComplex64: return launch_scan<F32, 2>(data, n, counts, stream);
    case DType::kComplex128: return launch_scan<F64, 2>(data, n, counts, stream);
    case DType::kFloat8E4M3FN: return launch_scan<E4M3FN>(data, n, counts, stream);
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2FNUZ: return launch_scan<FNUZ>(data, n, counts, stream);
    case DType::kFloat8E8M0FNU: return launch_scan<E8M0>(data, n, counts, stream);
    case DType::kFloat8E5M2: return launch_scan<E5M2>(data, n, counts, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace ckpt::cuda
