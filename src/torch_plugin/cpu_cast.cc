// The plugins' casts: LibTorch's CPU kernels, so that they round exactly as
// torch. Nothing here may throw across the interface (plugin/plugin_entry.cc).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include <exception>
#include <string>

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
