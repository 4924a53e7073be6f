// The CUDA backend: slabs are assembled in pieces through a ring of lanes,
// each a CUDA stream with its own pinned input buffer, device buffers and
// counters. For piece p the host threads gather its rows from the mapped
// sources into the lane's pinned buffer (the one copy the bytes need anyway:
// pageable memory cannot be copied to the device asynchronously), then the
// lane's stream copies them to the device, casts and scans them in one
// kernel and copies the result back into the pinned slab buffer. While the
// device works on piece p, the host gathers piece p+1 into the next lane;
// the copies of one lane overlap the kernel of another.
//
// Why the gather is not done on the device: the sources are page-cache
// mappings; reaching the device means a CPU copy into pinned memory, and that
// copy can put every element at its output position for free.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "core/float_cast.h"
#include "core/parallel_ranges.h"
#include "cuda/cast_probe.h"
#include "cuda/cuda_api.h"
#include "cuda/device_buffers.h"
#include "cuda/kernels.h"
#include "torch_plugin/torch_cast.h"

namespace ckpt::cuda {
namespace {

// The host's cast, the CPU backend's own: native for the pairs float_cast.h
// covers (so NaN elements come out as the CPU backend writes them), else
// LibTorch. Null, or the error.
const char* host_cast(const void* src, int from, void* dst, int to, std::size_t n, int threads) {
  DType f = static_cast<DType>(from), t = static_cast<DType>(to);
  if (!has_native_cast(f, t)) return torch_cast(src, from, dst, to, n, threads);
  std::size_t in = torch_element_size(from), out = torch_element_size(to);
  for_each_range(static_cast<int64_t>(n), useful_threads(n * in, threads), [&](int, int64_t a, int64_t b) {
    native_cast(static_cast<const std::byte*>(src) + static_cast<std::size_t>(a) * in, f,
                static_cast<std::byte*>(dst) + static_cast<std::size_t>(a) * out, t, static_cast<std::size_t>(b - a));
  });
  return nullptr;
}

// Three lanes: one being gathered by the host, one in flight on the device,
// one draining its output back; more only adds memory.
constexpr int kLanes = 3;
// Input bytes of a piece at most: large enough that a copy runs at full
// bus speed (a pinned 8 MiB copy spends ~10 us of its ~300 us at 25 GB/s
// starting), small enough that a slab fills the pipeline: the executor's
// slabs hold under 32 MiB of input (exec/tensor_copy.cc, two slabs and their
// casts in 64 MiB), so 64 MiB pieces, as before, made every slab one piece
// and the lanes never overlapped.
constexpr std::size_t kPieceBytes = 8u << 20;

struct Lane {
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  PinnedBuffer host_in;
  DeviceBuffer dev_in, dev_out;
  PieceCounts* host_counts = nullptr;  // pinned
  PieceCounts* dev_counts = nullptr;
  // The piece in flight, for finishing it.
  bool busy = false;
  bool fix_nan = false;  // cast on the device: NaN inputs get the host cast
  std::size_t n = 0;
  std::byte* out = nullptr;
};

// How one slab's pieces are processed, decided once per slab.
struct SlabPlan {
  std::size_t in_size, out_size;  // bytes per element
  bool cast;                      // in_dtype != out_dtype
  bool device_cast;               // ... by a device kernel (else on the host)
  bool scan;                      // a device scan (no kernel: a dtype without NaN/Inf)
};

class Engine {
 public:
  Engine(int device, uint64_t device_budget, int host_threads);
  ~Engine();
  const std::string& name() const { return name_; }
  void assemble(const CkptSlabJob& job, CkptSlabResult& result);

 private:
  bool device_cast(int from, int to);
  void drain();
  void gather(const CkptSlabJob& job, int64_t r0, int64_t r1, std::byte* dst);
  void finish(Lane& lane, int from, int to, CkptSlabResult& result);
  void assemble_on_host(const CkptSlabJob& job, std::byte* out);
  void submit_piece(Lane& lane, const CkptSlabJob& job, const SlabPlan& plan, int64_t r0, int64_t r1, std::byte* out);

  int device_;
  int host_threads_;
  std::size_t piece_budget_;  // device bytes of one lane (input + output)
  std::string name_;
  std::array<Lane, kLanes> lanes_;
  PinnedBuffer outs_[2];  // slab outputs, used in turn (exec/backend.h SlabResult)
  int next_out_ = 0;
  std::map<std::pair<int, int>, bool> cast_on_device_;  // probed once per pair
};

Engine::Engine(int device, uint64_t device_budget, int host_threads)
    : device_(device), host_threads_(std::max(1, host_threads)) {
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device < 0 || device >= count) throw std::runtime_error("no CUDA device " + std::to_string(device));
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  name_ = "cuda:" + std::to_string(device) + " (" + prop.name + ")";
  std::size_t free_bytes = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  // Never more than half of what is free: other processes share the device.
  uint64_t budget = std::min<uint64_t>(device_budget, free_bytes / 2);
  piece_budget_ = std::max<std::size_t>(2u << 20, budget / kLanes);
  for (Lane& lane : lanes_) {
    check_cuda(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&lane.done, cudaEventDisableTiming), "cudaEventCreate");
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, sizeof(PieceCounts), cudaHostAllocDefault), "cudaHostAlloc (counters)");
    lane.host_counts = static_cast<PieceCounts*>(p);
    check_cuda(cudaMalloc(&p, sizeof(PieceCounts)), "cudaMalloc (counters)");
    lane.dev_counts = static_cast<PieceCounts*>(p);
  }
}

Engine::~Engine() {
  cudaSetDevice(device_);
  for (Lane& lane : lanes_) {
    if (lane.stream) cudaStreamSynchronize(lane.stream);
    if (lane.done) cudaEventDestroy(lane.done);
    if (lane.stream) cudaStreamDestroy(lane.stream);
    if (lane.host_counts) cudaFreeHost(lane.host_counts);
    if (lane.dev_counts) cudaFree(lane.dev_counts);
  }
}

bool Engine::device_cast(int from, int to) {
  if (!has_cast_kernel(from, to)) return false;
  auto key = std::make_pair(from, to);
  auto it = cast_on_device_.find(key);
  if (it != cast_on_device_.end()) return it->second;
  std::string mismatch = probe_cast_rule(from, to, host_threads_);
  if (!mismatch.empty()) name_ += "; a cast runs on the host (" + mismatch + ")";
  return cast_on_device_[key] = mismatch.empty();
}

void Engine::gather(const CkptSlabJob& job, int64_t r0, int64_t r1, std::byte* dst) {
  std::size_t row_bytes = job.row_elems * torch_element_size(job.in_dtype);
  int parts = useful_threads(static_cast<uint64_t>(r1 - r0) * row_bytes, host_threads_);
  for_each_range(r1 - r0, parts, [&](int, int64_t a, int64_t b) {
    if (const char* err = job.gather(job.gather_ctx, r0 + a, r0 + b, dst + static_cast<std::size_t>(a) * row_bytes))
      throw std::runtime_error(err);
  });
}

// Waits for the lane's piece; a cast piece that had NaN inputs is cast again
// on the host, from the pinned input still in the lane, over the device's
// output (cast_rules.h says why).
void Engine::finish(Lane& lane, int from, int to, CkptSlabResult& result) {
  if (!lane.busy) return;
  lane.busy = false;
  check_cuda(cudaEventSynchronize(lane.done), "piece on the device");
  result.nan += lane.host_counts->out_nan;
  result.inf += lane.host_counts->out_inf;
  if (lane.fix_nan && lane.host_counts->in_nan > 0)
    if (const char* err = host_cast(lane.host_in.data(), from, lane.out, to, lane.n, host_threads_))
      throw std::runtime_error(std::string("host cast of a piece with NaN: ") + err);
}

// After a failed slab, lanes may still hold pieces in flight: wait for them
// and forget them, so that their counts never reach the next slab.
void Engine::drain() {
  for (Lane& lane : lanes_) {
    if (lane.busy) cudaEventSynchronize(lane.done);
    lane.busy = false;
  }
}

void Engine::assemble(const CkptSlabJob& job, CkptSlabResult& result) {
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  drain();
  SlabPlan plan{torch_element_size(job.in_dtype), torch_element_size(job.out_dtype), job.in_dtype != job.out_dtype,
                false, job.scan && has_scan_kernel(job.out_dtype)};
  if (plan.in_size == 0 || plan.out_size == 0) throw std::runtime_error("unknown dtype code");
  plan.device_cast = plan.cast && device_cast(job.in_dtype, job.out_dtype);
  std::size_t in_row = job.row_elems * plan.in_size, out_row = job.row_elems * plan.out_size;
  PinnedBuffer& slab_out = outs_[next_out_];
  next_out_ ^= 1;
  slab_out.reserve(std::max<std::size_t>(1, static_cast<std::size_t>(job.rows) * out_row));
  result = CkptSlabResult{};
  if (!plan.device_cast && !plan.scan) {
    assemble_on_host(job, slab_out.data());
  } else {
    // A row larger than a piece makes a piece of one row (buffers grow).
    int64_t rows_per_piece = std::max<int64_t>(
        1, static_cast<int64_t>(std::min(kPieceBytes / std::max<std::size_t>(in_row, 1),
                                         piece_budget_ / std::max<std::size_t>(in_row + out_row, 1))));
    int next = 0;
    for (int64_t r0 = 0; r0 < job.rows; r0 += rows_per_piece, next = (next + 1) % kLanes) {
      Lane& lane = lanes_[static_cast<std::size_t>(next)];
      finish(lane, job.in_dtype, job.out_dtype, result);
      submit_piece(lane, job, plan, r0, std::min(job.rows, r0 + rows_per_piece),
                   slab_out.data() + static_cast<std::size_t>(r0) * out_row);
    }
    for (Lane& lane : lanes_) finish(lane, job.in_dtype, job.out_dtype, result);
  }
  if (!job.scan) result.nan = result.inf = 0;
  if (job.keep_output) {
    result.out = slab_out.data();
    result.out_bytes = static_cast<uint64_t>(job.rows) * out_row;
  }
}

// Nothing for the device (a cast without a kernel, no scan): gather, and
// cast, on the host.
void Engine::assemble_on_host(const CkptSlabJob& job, std::byte* out) {
  if (job.in_dtype == job.out_dtype) {
    gather(job, 0, job.rows, out);
    return;
  }
  std::size_t n = static_cast<std::size_t>(job.rows) * job.row_elems;
  lanes_[0].host_in.reserve(n * torch_element_size(job.in_dtype));
  gather(job, 0, job.rows, lanes_[0].host_in.data());
  if (const char* err = host_cast(lanes_[0].host_in.data(), job.in_dtype, out, job.out_dtype, n, host_threads_))
    throw std::runtime_error(err);
}

// Gathers rows [r0, r1) on the host and queues their copy to the device,
// cast and scan and the copy of the result to `out` on the lane's stream.
void Engine::submit_piece(Lane& lane, const CkptSlabJob& job, const SlabPlan& plan, int64_t r0, int64_t r1,
                          std::byte* out) {
  std::size_t n = static_cast<std::size_t>(r1 - r0) * job.row_elems;
  lane.n = n;
  lane.out = out;
  lane.fix_nan = plan.device_cast && job.keep_output;
  // What the device reads: the gathered input (device cast, or no cast:
  // gathered straight into the output), or the host's cast of it.
  const std::byte* host_src = out;
  std::size_t dev_bytes = n * plan.out_size;
  if (plan.cast) {
    lane.host_in.reserve(n * plan.in_size);
    gather(job, r0, r1, lane.host_in.data());
    if (plan.device_cast) {
      host_src = lane.host_in.data();
      dev_bytes = n * plan.in_size;
    } else if (const char* err = host_cast(lane.host_in.data(), job.in_dtype, out, job.out_dtype, n, host_threads_)) {
      throw std::runtime_error(err);
    }
  } else {
    gather(job, r0, r1, out);
  }
  lane.dev_in.reserve(dev_bytes);
  check_cuda(cudaMemsetAsync(lane.dev_counts, 0, sizeof(PieceCounts), lane.stream), "cudaMemsetAsync");
  check_cuda(cudaMemcpyAsync(lane.dev_in.data(), host_src, dev_bytes, cudaMemcpyHostToDevice, lane.stream),
             "copy to device");
  if (plan.device_cast) {
    lane.dev_out.reserve(n * plan.out_size);
    check_cuda(cast_and_count_async(lane.dev_in.data(), job.in_dtype, lane.dev_out.data(), job.out_dtype, n, plan.scan,
                                    lane.dev_counts, lane.stream),
               "cast kernel");
    if (job.keep_output)
      check_cuda(cudaMemcpyAsync(out, lane.dev_out.data(), n * plan.out_size, cudaMemcpyDeviceToHost, lane.stream),
                 "copy from device");
  } else {
    check_cuda(count_nonfinite_async(lane.dev_in.data(), job.out_dtype, n, lane.dev_counts, lane.stream),
               "scan kernel");
  }
  check_cuda(
      cudaMemcpyAsync(lane.host_counts, lane.dev_counts, sizeof(PieceCounts), cudaMemcpyDeviceToHost, lane.stream),
      "copy counters");
  check_cuda(cudaEventRecord(lane.done, lane.stream), "cudaEventRecord");
  lane.busy = true;
}

thread_local std::string last_error;

const char* failure(const char* what, const std::exception& e) {
  last_error = std::string(what) + ": " + e.what();
  return last_error.c_str();
}

}  // namespace

const char* api_open(int device, uint64_t device_budget, int host_threads, CkptCudaBackend** out) {
  try {
    *out = reinterpret_cast<CkptCudaBackend*>(new Engine(device, device_budget, host_threads));
    return nullptr;
  } catch (const std::exception& e) {
    return failure("CUDA backend", e);
  }
}

void api_close(CkptCudaBackend* backend) { delete reinterpret_cast<Engine*>(backend); }

const char* api_name(CkptCudaBackend* backend) { return reinterpret_cast<Engine*>(backend)->name().c_str(); }

const char* api_assemble(CkptCudaBackend* backend, const CkptSlabJob* job, CkptSlabResult* result) {
  try {
    reinterpret_cast<Engine*>(backend)->assemble(*job, *result);
    return nullptr;
  } catch (const std::exception& e) {
    return failure("CUDA backend", e);
  }
}

}  // namespace ckpt::cuda
