// CPU backend on LibTorch's kernels, so that casts round exactly as torch.
// This TU includes ATen and therefore must not include spdlog (fmt clash).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include "core/error.h"
#include "exec/backend.h"
#include "exec/torch_dtype.h"

namespace ckpt {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) {
    if (threads > 0) at::set_num_threads(threads);
  }
  std::string name() const override { return "cpu"; }

  void cast(const std::byte* src, DType from, std::byte* dst, DType to, std::size_t n) override {
    auto count = static_cast<int64_t>(n);
    auto opts_from = at::TensorOptions().dtype(to_scalar_type(from));
    auto opts_to = at::TensorOptions().dtype(to_scalar_type(to));
    at::Tensor in = at::from_blob(const_cast<std::byte*>(src), {count}, opts_from);
    at::Tensor out = at::from_blob(dst, {count}, opts_to);
    out.copy_(in);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace ckpt
