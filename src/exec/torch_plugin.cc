// Loads libckpt_torch.so on first use (see torch_plugin_api.h for why) and
// provides the runtime facts that need LibTorch.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "exec/libtorch_locate.h"
#include "exec/runtime_info.h"
#include "exec/torch_plugin.h"
#include "exec/torch_plugin_api.h"

namespace ckpt {
namespace {

struct Plugin {
  const CkptTorchApi* api = nullptr;
  std::string error;
  bool installation = false;  // the error is a broken install (exit 5), not a missing feature
};

// Which LibTorch the plugins use, found once (libtorch_locate.h).
const LibTorchLocation& libtorch() {
  static const LibTorchLocation where = locate_libtorch();
  return where;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : "; ") + s;
  return out;
}

// The plugin at `path`, after LibTorch's own libraries: the plugin's run
// path names the build's LibTorch, which an installed copy may not have.
Plugin load_plugin(const std::string& path, bool cuda) {
  Plugin loaded;
  const LibTorchLocation& torch = libtorch();
  if (torch.dir.empty()) {
    loaded.installation = true;
    loaded.error = "installation problem: LibTorch not found (searched " + joined(torch.searched) +
                   "); set CKPTCONV_LIBTORCH to the lib folder of a torch " CKPT_BUILD_TORCH_VERSION
                   " install, e.g. $(python -c 'import torch, os; print(os.path.dirname(torch.__file__))')/lib";
    return loaded;
  }
  if (std::string why = preload_libtorch(torch.dir, cuda); !why.empty()) {
    loaded.installation = true;
    loaded.error =
        "installation problem: cannot load LibTorch from " + torch.dir + " (found by " + torch.found_by + "): " + why;
    return loaded;
  }
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    loaded.installation = true;
    loaded.error =
        "installation problem: cannot load the LibTorch plugin " + path + ": " + (why ? why : "unknown error");
    return loaded;
  }
  auto entry = reinterpret_cast<CkptTorchApiEntry>(::dlsym(handle, CKPT_TORCH_API_ENTRY));
  const CkptTorchApi* api = entry ? entry() : nullptr;
  if (!api || api->api_version != CKPT_TORCH_API_VERSION) {
    loaded.installation = true;
    loaded.error = "installation problem: " + path + " is not a compatible ckptconv LibTorch plugin";
    return loaded;
  }
  loaded.api = api;
  return loaded;
}

// libckpt_torch.so (LibTorch CPU only), beside the executable or in
// ../lib/ckptconv; CKPT_TORCH_PLUGIN names it elsewhere.
const Plugin& cpu_plugin() {
  static const Plugin p = [] {
    const char* env = std::getenv("CKPT_TORCH_PLUGIN");
    std::vector<std::string> searched;
    std::string path = env && *env ? env : find_plugin("libckpt_torch.so", &searched);
    if (path.empty()) {
      Plugin none;
      none.installation = true;
      none.error = "installation problem: the LibTorch plugin libckpt_torch.so is missing (searched " +
                   joined(searched) +
                   "); install ckptconv with its plugins (cmake --install BUILD --prefix P), or set "
                   "CKPT_TORCH_PLUGIN to the plugin's path";
      return none;
    }
    return load_plugin(path, false);
  }();
  return p;
}

// libckpt_torch_cuda.so, found as the CPU one; CKPT_TORCH_CUDA_PLUGIN names
// one elsewhere (tests point both variables at a build folder). Absent in
// builds without CUDA.
std::string cuda_plugin_path() {
  const char* env = std::getenv("CKPT_TORCH_CUDA_PLUGIN");
  return env && *env ? env : find_plugin("libckpt_torch_cuda.so", nullptr);
}

const Plugin& cuda_plugin_loaded() {
  static const Plugin p = [] {
    std::string path = cuda_plugin_path();
    if (path.empty() || ::access(path.c_str(), R_OK) != 0) {
      Plugin none;
      none.error = "this ckptconv was built without CUDA (no libckpt_torch_cuda.so)";
      return none;
    }
    return load_plugin(path, true);
  }();
  return p;
}

// The CUDA plugin when this build has one, else the CPU plugin.
const Plugin& device_plugin() {
  const Plugin& cuda = cuda_plugin_loaded();
  std::string path = cuda_plugin_path();
  return cuda.api || (!path.empty() && ::access(path.c_str(), R_OK) == 0) ? cuda : cpu_plugin();
}

}  // namespace

const CkptTorchApi& require_torch_plugin(const char* purpose) {
  const Plugin& p = cpu_plugin();
  if (!p.api)
    fail(p.installation ? ErrorCode::kInstallation : ErrorCode::kUnimplemented,
         p.error + " (needed for " + purpose + ")");
  return *p.api;
}

const CkptTorchApi* cuda_plugin(std::string* why) {
  const Plugin& p = cuda_plugin_loaded();
  if (p.api && !p.api->cuda_open) {
    if (why) *why = "the CUDA plugin has no CUDA backend";
    return nullptr;
  }
  if (!p.api && why) *why = p.error;
  return p.api;
}

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  const Plugin& p = device_plugin();
  if (!p.api) {
    info.libtorch_version = "unavailable (" + p.error + ")";
    return info;
  }
  info.libtorch_version = p.api->libtorch_version;
  info.libtorch_dir = libtorch().dir;
  info.libtorch_found_by = libtorch().found_by;
  info.cuda_compiled = p.api->cuda_compiled != 0;
  info.cuda_devices = p.api->cuda_device_count();
  info.cuda_available = info.cuda_devices > 0;
  return info;
}

}  // namespace ckpt
