/* The C interface between ckptconv and its LibTorch plugin (libckpt_torch.so).
 *
 * LibTorch is loaded only when arithmetic needs it (a dtype cast, a device
 * query): loading it costs ~0.7 s and ~600 MB of resident memory (its CUDA
 * libraries), which a plain consolidate — bytes moved file to file — must
 * not pay. A C interface keeps exceptions and C++ ABI details from crossing
 * the dlopen boundary. */
#pragma once

#include <stddef.h>

#define CKPT_TORCH_API_VERSION 1

struct CkptTorchApi {
  int api_version;                 /* CKPT_TORCH_API_VERSION */
  const char* libtorch_version;    /* TORCH_VERSION the plugin was built with */
  int cuda_compiled;               /* built with CKPT_WITH_CUDA */
  int (*cuda_device_count)(void);  /* devices visible now; 0 when none */
  /* Converts n elements (dtypes are ckpt::DType values) as torch's
   * Tensor.to does. Returns NULL, or an error message valid until the next
   * call on this thread. */
  const char* (*cast)(const void* src, int from_dtype, void* dst, int to_dtype, size_t n, int threads);
};

typedef const struct CkptTorchApi* (*CkptTorchApiEntry)(void);
#define CKPT_TORCH_API_ENTRY "ckpt_torch_api"
