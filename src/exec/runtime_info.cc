#include "exec/runtime_info.h"

#include <torch/cuda.h>
#include <torch/version.h>

namespace ckpt {

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.libtorch_version = TORCH_VERSION;
#ifdef CKPT_HAVE_CUDA
  info.cuda_compiled = true;
  info.cuda_available = torch::cuda::is_available();
  info.cuda_devices = info.cuda_available ? static_cast<int>(torch::cuda::device_count()) : 0;
#endif
  return info;
}

}  // namespace ckpt
