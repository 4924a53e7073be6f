// RAII owners of the CUDA backend's memory and error checks for the CUDA
// runtime calls. Host staging buffers are pinned (page-locked): only from
// pinned memory do cudaMemcpyAsync copies run asynchronously, at full
// PCIe/NVLink speed, overlapping the kernels of other streams.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace ckpt::cuda {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Grows on demand, never shrinks: a consolidate reuses the same buffers for
// thousands of slabs.
template <bool kPinned>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer() { release(); }

  void reserve(std::size_t bytes) {
    if (bytes <= size_) return;
    release();
    void* p = nullptr;
    if constexpr (kPinned)
      check_cuda(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc (pinned staging)");
    else
      check_cuda(cudaMalloc(&p, bytes), "cudaMalloc (device buffer)");
    data_ = static_cast<std::byte*>(p);
    size_ = bytes;
  }
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void release() {
    if (!data_) return;
    if constexpr (kPinned)
      cudaFreeHost(data_);
    else
      cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

using PinnedBuffer = CudaBuffer<true>;
using DeviceBuffer = CudaBuffer<false>;

}  // namespace ckpt::cuda
