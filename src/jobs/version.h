// `ckptconv --version`: the build and the LibTorch it would load, found
// without loading it (instant). `ckptconv version`: also loads LibTorch and
// the CUDA plugin, and says which devices are visible and what --device auto
// picks (about a second: LibTorch's libraries are large).
#pragma once

#include <string>

namespace ckpt::jobs {

std::string version_text();
std::string runtime_text();

}  // namespace ckpt::jobs
