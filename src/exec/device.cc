// --device: which backend a command runs on.
#include "core/error.h"
#include "exec/backend.h"
#include "exec/runtime_info.h"

namespace ckpt {

std::unique_ptr<Backend> make_backend(Device device, int threads) {
  if (device == Device::kCuda) {
    RuntimeInfo info = runtime_info();
    if (!info.cuda_compiled) fail_invalid("--device cuda: this ckptconv was built without CUDA (CKPT_WITH_CUDA=OFF)");
    if (!info.cuda_available) fail_invalid("--device cuda: no CUDA device is visible");
    fail_invalid("--device cuda: the CUDA backend is not built yet");
  }
  return make_cpu_backend(threads);
}

}  // namespace ckpt
