#include "jobs/version.h"

#include <exception>

#include "exec/backend.h"
#include "exec/libtorch_locate.h"
#include "exec/runtime_info.h"

namespace ckpt::jobs {

std::string version_text() {
  LibTorchLocation where = locate_libtorch();
  std::string libtorch =
      where.dir.empty() ? std::string("not found (ckptconv version says where it looked)")
                        : std::string(build_torch_version()) + " (" + where.dir + ", found by " + where.found_by + ")";
  return std::string("ckptconv ") + CKPT_VERSION + "\nLibTorch " + libtorch +
         "\n(`ckptconv version` loads it and reports CUDA and what --device auto picks)";
}

std::string runtime_text() {
  RuntimeInfo info = runtime_info();
  std::string cuda =
      info.cuda_compiled
          ? (info.cuda_available ? "compiled in, " + std::to_string(info.cuda_devices) + " device(s) visible"
                                 : "compiled in, no device visible")
          : "not compiled in";
  std::string backend;
  try {
    backend = describe_auto_backend();
  } catch (const std::exception& e) {
    backend = std::string("cpu (the CUDA backend failed to start: ") + e.what() + ")";
  }
  std::string libtorch = info.libtorch_version;
  if (!info.libtorch_dir.empty()) libtorch += " (" + info.libtorch_dir + ", found by " + info.libtorch_found_by + ")";
  return std::string("ckptconv ") + CKPT_VERSION + "\nLibTorch " + libtorch + "\nCUDA " + cuda +
         "\n--device auto: " + backend;
}

}  // namespace ckpt::jobs
