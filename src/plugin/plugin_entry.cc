// libckpt_torch.so and libckpt_torch_cuda.so: LibTorch behind the C table of
// exec/torch_plugin_api.h. The one place that knows both halves of a plugin:
// the CPU casts (torch_plugin/) and, in the CUDA build, the CUDA backend
// (cuda/), which itself uses the casts. So torch_plugin depends on neither,
// cuda on torch_plugin, and this entry on both: no cycle between the folders.
// Nothing here may throw across the interface.
#include <torch/version.h>
#ifdef CKPT_HAVE_CUDA
#include <torch/cuda.h>

#include "cuda/cuda_api.h"
#endif

#include <exception>

#include "exec/torch_plugin_api.h"
#include "torch_plugin/torch_cast.h"

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
