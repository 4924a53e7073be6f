// The CUDA backend's entry points in the plugin's C table
// (exec/torch_plugin_api.h). None of them throws.
#pragma once

#include "exec/torch_plugin_api.h"

namespace ckpt::cuda {

const char* api_open(int device, uint64_t device_budget, int host_threads, CkptCudaBackend** out);
void api_close(CkptCudaBackend* backend);
const char* api_name(CkptCudaBackend* backend);
const char* api_assemble(CkptCudaBackend* backend, const CkptSlabJob* job, CkptSlabResult* result);

}  // namespace ckpt::cuda
