// Device kernels of the CUDA backend, launched on a caller's stream. Plain
// C++ declarations so that cuda_backend.cc compiles with the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ckpt::cuda {

// Counters one piece accumulates on the device (zeroed by the caller).
struct PieceCounts {
  unsigned long long in_nan;   // NaN among the inputs of a cast
  unsigned long long out_nan;  // NaN and Inf among the outputs (the scan)
  unsigned long long out_inf;
};

// True when cast_and_count_async() has a kernel for this pair of ckpt::DType codes.
bool has_cast_kernel(int from_dtype, int to_dtype);
// True when count_nonfinite_async() has a kernel for this dtype (every floating dtype).
bool has_scan_kernel(int dtype);

// Converts n elements from `in` to `out`, counting NaN inputs into
// counts->in_nan and, when `scan`, NaN/Inf outputs as the scan does.
cudaError_t cast_and_count_async(const void* in, int from_dtype, void* out, int to_dtype, std::size_t n, bool scan,
                                 PieceCounts* counts, cudaStream_t stream);
// Counts NaN/Inf among n elements into counts->out_nan/out_inf.
cudaError_t count_nonfinite_async(const void* data, int dtype, std::size_t n, PieceCounts* counts, cudaStream_t stream);

}  // namespace ckpt::cuda
