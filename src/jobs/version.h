// `ckptconv --version`: the build, LibTorch, CUDA and what --device auto picks.
#pragma once

#include <string>

namespace ckpt::jobs {

std::string version_text();

}  // namespace ckpt::jobs
