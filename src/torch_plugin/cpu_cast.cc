// libckpt_torch.so: LibTorch behind the C interface of exec/torch_plugin_api.h.
// Casts run on LibTorch's CPU kernels so that they round exactly as torch.
// Nothing here may throw across the interface.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <torch/version.h>
#ifdef CKPT_HAVE_CUDA
#include <torch/cuda.h>

#include "cuda/cuda_api.h"
#endif

#include <exception>
#include <string>

#include "exec/torch_plugin_api.h"
#include "torch_plugin/torch_cast.h"
#include "torch_plugin/torch_dtype.h"

namespace ckpt {

namespace {
thread_local std::string last_error;
}  // namespace

const char* torch_cast(const void* src, int from, void* dst, int to, size_t n, int threads) {
  try {
    auto from_type = to_scalar_type(from), to_type = to_scalar_type(to);
    if (!from_type || !to_type) {
      last_error = "unknown dtype code";
      return last_error.c_str();
    }
    if (threads > 0 && at::get_num_threads() != threads) at::set_num_threads(threads);
    auto count = static_cast<int64_t>(n);
    at::Tensor in = at::from_blob(const_cast<void*>(src), {count}, at::TensorOptions().dtype(*from_type));
    at::Tensor out = at::from_blob(dst, {count}, at::TensorOptions().dtype(*to_type));
    out.copy_(in);
    return nullptr;
  } catch (const std::exception& e) {
    last_error = e.what();
    return last_error.c_str();
  }
}

std::size_t torch_element_size(int dtype) {
  auto type = to_scalar_type(dtype);
  return type ? c10::elementSize(*type) : 0;
}

}  // namespace ckpt

namespace {

int cuda_device_count() {
#ifdef CKPT_HAVE_CUDA
  try {
    return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  } catch (const std::exception&) {
    return 0;
  }
#else
  return 0;
#endif
}

const CkptTorchApi kApi = {
    CKPT_TORCH_API_VERSION,
    TORCH_VERSION,
#ifdef CKPT_HAVE_CUDA
    1,
#else
    0,
#endif
    cuda_device_count,
    ckpt::torch_cast,
#ifdef CKPT_HAVE_CUDA
    ckpt::cuda::api_open,
    ckpt::cuda::api_close,
    ckpt::cuda::api_name,
    ckpt::cuda::api_assemble,
#else
    nullptr,
    nullptr,
    nullptr,
    nullptr,
#endif
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const CkptTorchApi* ckpt_torch_api() { return &kApi; }
