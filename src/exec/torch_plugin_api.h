/* The C interface between ckptconv and its LibTorch plugins: libckpt_torch.so
 * (LibTorch CPU: casts) and libckpt_torch_cuda.so (also the CUDA backend).
 *
 * LibTorch is loaded only when arithmetic needs it (a dtype cast, a device):
 * loading it costs ~0.7 s and ~600 MB of resident memory (its CUDA
 * libraries), which a plain consolidate — bytes moved file to file — must
 * not pay. A C interface keeps exceptions and C++ ABI details from crossing
 * the dlopen boundary. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define CKPT_TORCH_API_VERSION 2

/* Writes rows [r0, r1) of a slab, contiguous, in the slab's input dtype, to
 * dst. Called from several threads at once for disjoint ranges. Returns
 * NULL, or an error message valid until the job returns. */
typedef const char* (*CkptGatherRows)(void* ctx, int64_t r0, int64_t r1, void* dst);

/* One slab for the CUDA backend (exec/backend.h SlabJob). */
struct CkptSlabJob {
  int in_dtype, out_dtype; /* ckpt::DType values; equal: no cast */
  int64_t rows;
  uint64_t row_elems;
  CkptGatherRows gather;
  void* gather_ctx;
  int scan;        /* count NaN/Inf of the output */
  int keep_output; /* 0: only the counts are wanted */
};

/* What a slab produced: out_bytes bytes at out (NULL when keep_output was 0),
 * owned by the backend until its next call; NaN and Inf of the output. */
struct CkptSlabResult {
  const void* out;
  uint64_t out_bytes;
  uint64_t nan, inf;
};

struct CkptCudaBackend; /* opaque: one device, its streams and buffers */

struct CkptTorchApi {
  int api_version;                /* CKPT_TORCH_API_VERSION */
  const char* libtorch_version;   /* TORCH_VERSION the plugin was built with */
  int cuda_compiled;              /* built with CKPT_WITH_CUDA */
  int (*cuda_device_count)(void); /* devices visible now; 0 when none */
  /* Converts n elements (dtypes are ckpt::DType values) as torch's
   * Tensor.to does. Returns NULL, or an error message valid until the next
   * call on this thread. */
  const char* (*cast)(const void* src, int from_dtype, void* dst, int to_dtype, size_t n, int threads);

  /* The CUDA backend; NULL in the CPU plugin. Errors as for cast. */
  /* Opens device `device` with at most device_budget bytes of device memory
   * for its buffers and host_threads threads for host-side gathers. */
  const char* (*cuda_open)(int device, uint64_t device_budget, int host_threads, struct CkptCudaBackend** out);
  void (*cuda_close)(struct CkptCudaBackend* backend);
  /* "cuda:0 (NVIDIA H200)" */
  const char* (*cuda_name)(struct CkptCudaBackend* backend);
  const char* (*cuda_assemble)(struct CkptCudaBackend* backend, const struct CkptSlabJob* job,
                               struct CkptSlabResult* result);
};

typedef const struct CkptTorchApi* (*CkptTorchApiEntry)(void);
#define CKPT_TORCH_API_ENTRY "ckpt_torch_api"
