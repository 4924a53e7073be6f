// --device: which backend a command runs on, and the Backend that drives the
// CUDA plugin's backend (src/cuda) through the C table of torch_plugin_api.h.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "exec/backend.h"
#include "exec/runtime_info.h"
#include "exec/torch_plugin.h"
#include "io/storage.h"

namespace ckpt {
namespace {

// Device memory for the CUDA backend's buffers (input and output of three
// pieces in flight); the plugin takes at most half of what is free.
constexpr uint64_t kDeviceBudget = 1ull << 30;

// One engine per process drives the device (three lanes, two slab buffers
// used in turn), and callers share it: validate's scan workers call
// scan_finite from every thread at once. Each call holds the engine for its
// whole slab, and cast() copies its result out before letting go, since the
// next caller's slab may reuse that buffer. (Without the lock, validate
// --finite --device cuda crashed on an H100 with 16 workers.)
class CudaBackend final : public Backend {
 public:
  CudaBackend(const CkptTorchApi& api, int threads) : api_(api) {
    int host_threads = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (const char* err = api_.cuda_open(0, kDeviceBudget, host_threads, &handle_))
      fail(ErrorCode::kResourceExhausted, std::string("--device cuda: ") + err);
  }
  ~CudaBackend() override { api_.cuda_close(handle_); }

  std::string name() const override { return api_.cuda_name(handle_); }

  void cast(const std::byte* src, DType from, std::byte* dst, DType to, std::size_t n) override {
    std::lock_guard<std::mutex> hold(engine_);
    SlabResult r = assemble_held(host_buffer_job(src, from, to, n, false));
    std::memcpy(dst, r.bytes.data(), r.bytes.size());
  }

  FiniteCounts scan_finite(const std::byte* data, DType dtype, std::size_t n) override {
    std::lock_guard<std::mutex> hold(engine_);
    return assemble_held(host_buffer_job(data, dtype, dtype, n, true)).finite;
  }

  SlabResult assemble(const SlabJob& job) override {
    std::lock_guard<std::mutex> hold(engine_);
    return assemble_held(job);
  }

 private:
  SlabResult assemble_held(const SlabJob& job) {
    CkptSlabJob c{};
    c.in_dtype = static_cast<int>(job.dtype);
    c.out_dtype = static_cast<int>(job.out_dtype);
    c.rows = job.rows;
    c.row_elems = job.row_elems;
    c.gather = &gather_trampoline;
    GatherContext ctx;
    ctx.job = &job;
    c.gather_ctx = &ctx;
    c.scan = job.scan ? 1 : 0;
    c.keep_output = job.keep_output ? 1 : 0;
    CkptSlabResult r{};
    if (const char* err = api_.cuda_assemble(handle_, &c, &r)) {
      // An error of ours raised inside a gather keeps its code and context.
      if (ctx.error) std::rethrow_exception(ctx.error);
      std::string message = err;
      bool no_memory = message.find("out of memory") != std::string::npos;
      fail(no_memory ? ErrorCode::kResourceExhausted : ErrorCode::kInternal, message);
    }
    SlabResult result;
    result.bytes = std::span<const std::byte>(static_cast<const std::byte*>(r.out), r.out_bytes);
    result.finite.nan = r.nan;
    result.finite.inf = r.inf;
    return result;
  }

  struct GatherContext {
    const SlabJob* job;
    std::mutex mutex;
    std::exception_ptr error;  // the first gather failure
  };

  // Called by the plugin's host threads; turns exceptions into the C
  // interface's error strings and keeps the first for rethrowing.
  static const char* gather_trampoline(void* ctx, int64_t r0, int64_t r1, void* dst) {
    auto* g = static_cast<GatherContext*>(ctx);
    try {
      g->job->gather(r0, r1, static_cast<std::byte*>(dst));
      return nullptr;
    } catch (const std::exception& e) {
      static thread_local std::string message;
      message = e.what();
      std::lock_guard<std::mutex> lock(g->mutex);
      if (!g->error) g->error = std::current_exception();
      return message.c_str();
    }
  }

  // A one-row-per-element slab read from a host buffer (cast, scan_finite).
  SlabJob host_buffer_job(const std::byte* src, DType from, DType to, std::size_t n, bool scan_only) {
    SlabJob job;
    job.dtype = from;
    job.out_dtype = to;
    job.rows = static_cast<int64_t>(n);
    job.row_elems = 1;
    std::size_t isz = dtype_size(from);
    job.gather = [src, isz](int64_t r0, int64_t r1, std::byte* dst) {
      std::memcpy(dst, src + static_cast<std::size_t>(r0) * isz, static_cast<std::size_t>(r1 - r0) * isz);
    };
    job.scan = scan_only;
    job.keep_output = !scan_only;
    return job;
  }

  const CkptTorchApi& api_;
  CkptCudaBackend* handle_ = nullptr;
  std::mutex engine_;  // held for each slab (see above)
};

// True when the NVIDIA driver exposes a device node. Without one no CUDA
// device can be visible, and loading the CUDA plugin to learn that would
// cost every run on a CPU machine ~1 s and ~500 MB of resident memory
// (libtorch_cuda and its libraries).
bool nvidia_device_node_present() {
  for (const DirEntry& entry : list_directory("/dev")) {
    const std::string& name = entry.name;
    if (name.size() > 6 && name.starts_with("nvidia") && std::isdigit(static_cast<unsigned char>(name[6]))) return true;
  }
  return false;
}

// The CUDA plugin when a device is visible; else nullptr and why not.
const CkptTorchApi* usable_cuda(std::string& why) {
  if (!nvidia_device_node_present()) {
    why = "no CUDA device is visible (no /dev/nvidia<N>)";
    return nullptr;
  }
  const CkptTorchApi* api = cuda_plugin(&why);
  if (!api) return nullptr;
  if (api->cuda_device_count() <= 0) {
    why = "no CUDA device is visible";
    return nullptr;
  }
  return api;
}

}  // namespace

std::unique_ptr<Backend> make_backend(Device device, int threads) {
  if (device == Device::kCpu) return make_cpu_backend(threads);
  std::string why;
  if (const CkptTorchApi* api = usable_cuda(why)) {
    if (device == Device::kCuda) return std::make_unique<CudaBackend>(*api, threads);
    try {
      return std::make_unique<CudaBackend>(*api, threads);
    } catch (const Error& e) {
      // auto promises a result, not a device: a GPU that cannot take the
      // backend (memory held by others) leaves the work to the CPU.
      spdlog::warn("--device auto: using the CPU, the CUDA backend failed to start: {}", e.what());
      return make_cpu_backend(threads);
    }
  }
  if (device == Device::kCuda) fail_invalid("--device cuda: " + why);
  spdlog::debug("--device auto: cpu, no CUDA backend: {}", why);
  return make_cpu_backend(threads);
}

std::string describe_auto_backend() {
  std::string why;
  if (usable_cuda(why)) return make_backend(Device::kAuto, 1)->name();
  return "cpu (" + why + ")";
}

}  // namespace ckpt
