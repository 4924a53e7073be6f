// Where the LibTorch plugins and LibTorch itself are at run time, so that an
// installed ckptconv can be moved and still find both (docs/install.md).
#pragma once

#include <string>
#include <vector>

namespace ckpt {

// A plugin file (libckpt_torch.so, libckpt_torch_cuda.so): beside the
// executable (the build tree) or in ../lib/ckptconv (an installed prefix).
// `searched` gets every path tried. Empty when none exists.
std::string find_plugin(const std::string& file, std::vector<std::string>* searched);

struct LibTorchLocation {
  std::string dir;                    // holds libtorch_cpu.so; empty when none was usable
  std::string found_by;               // how: "CKPTCONV_LIBTORCH", "the active Python environment (...)", ...
  std::vector<std::string> searched;  // "DIR: why not", for the message when none was usable
};

// In order: $CKPTCONV_LIBTORCH (a torch lib folder, or a torch package
// folder holding lib/), the torch package of the active Python environment
// ($VIRTUAL_ENV, then $CONDA_PREFIX), and the LibTorch this binary was built
// against. A candidate whose torch version differs from the build's is
// skipped (its C++ ABI would not match the plugin's).
LibTorchLocation locate_libtorch();

// The torch version the plugins were built against ("none" without LibTorch):
// the version of any LibTorch that locate_libtorch finds.
const char* build_torch_version();

// Loads LibTorch's libraries from `dir` into the global namespace, so the
// plugin's own dependencies resolve to them whatever its run path says.
// Empty on success, else dlerror's text.
std::string preload_libtorch(const std::string& dir, bool cuda);

}  // namespace ckpt
