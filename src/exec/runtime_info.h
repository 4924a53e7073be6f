// What the binary was built with and what it can use now, without exposing
// LibTorch headers to callers.
#pragma once

#include <string>

namespace ckpt {

struct RuntimeInfo {
  std::string libtorch_version;   // e.g. "2.15.0"
  std::string libtorch_dir;       // the lib folder it was loaded from
  std::string libtorch_found_by;  // how that folder was found (libtorch_locate.h)
  bool cuda_compiled = false;     // built with CKPT_WITH_CUDA
  bool cuda_available = false;    // a CUDA device is visible now
  int cuda_devices = 0;
};

RuntimeInfo runtime_info();

}  // namespace ckpt
