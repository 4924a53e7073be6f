// Access to libckpt_torch.so for the executor's own backends.
#pragma once

#include <string>

#include "exec/torch_plugin_api.h"

namespace ckpt {

// The CPU plugin, loaded on first use; Unimplemented naming `purpose`
// ("dtype casts") when it cannot be loaded.
const CkptTorchApi& require_torch_plugin(const char* purpose);

// The CUDA plugin (libckpt_torch_cuda.so beside the executable), loaded on
// first use; nullptr with the reason in *why when this build has none or
// it cannot be loaded.
const CkptTorchApi* cuda_plugin(std::string* why);

}  // namespace ckpt
