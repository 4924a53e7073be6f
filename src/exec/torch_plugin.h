// Access to libckpt_torch.so for the executor's own backends.
#pragma once

#include "exec/torch_plugin_api.h"

namespace ckpt {

// The CPU plugin, loaded on first use; Unimplemented naming `purpose`
// ("dtype casts") when it cannot be loaded.
const CkptTorchApi& require_torch_plugin(const char* purpose);

}  // namespace ckpt
