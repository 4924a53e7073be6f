// Loads libckpt_torch.so on first use (see torch_plugin_api.h for why) and
// provides the runtime facts that need LibTorch.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "exec/runtime_info.h"
#include "exec/torch_plugin.h"
#include "exec/torch_plugin_api.h"

namespace ckpt {
namespace {

std::string executable_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<std::size_t>(n));
  return path.substr(0, path.rfind('/'));
}

struct Plugin {
  const CkptTorchApi* api = nullptr;
  std::string error;
};

// libckpt_torch.so (LibTorch CPU only) or libckpt_torch_cuda.so (with CUDA),
// beside the executable; CKPT_TORCH_PLUGIN names the CPU one elsewhere.
Plugin load_plugin(const std::string& path) {
  Plugin loaded;
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    loaded.error = "cannot load the LibTorch plugin " + path + ": " + (why ? why : "unknown error");
    return loaded;
  }
  auto entry = reinterpret_cast<CkptTorchApiEntry>(::dlsym(handle, CKPT_TORCH_API_ENTRY));
  const CkptTorchApi* api = entry ? entry() : nullptr;
  if (!api || api->api_version != CKPT_TORCH_API_VERSION) {
    loaded.error = path + " is not a compatible ckptconv LibTorch plugin";
    return loaded;
  }
  loaded.api = api;
  return loaded;
}

const Plugin& cpu_plugin() {
  static const Plugin p = [] {
    const char* env = std::getenv("CKPT_TORCH_PLUGIN");
    return load_plugin(env && *env ? env : executable_dir() + "/libckpt_torch.so");
  }();
  return p;
}

// libckpt_torch_cuda.so beside the executable; CKPT_TORCH_CUDA_PLUGIN names
// one elsewhere (tests point both variables at a build folder).
std::string cuda_plugin_path() {
  const char* env = std::getenv("CKPT_TORCH_CUDA_PLUGIN");
  return env && *env ? env : executable_dir() + "/libckpt_torch_cuda.so";
}

const Plugin& cuda_plugin_loaded() {
  static const Plugin p = [] {
    std::string path = cuda_plugin_path();
    if (::access(path.c_str(), R_OK) != 0) {
      Plugin none;
      none.error = "this ckptconv was built without CUDA (no " + path + ")";
      return none;
    }
    return load_plugin(path);
  }();
  return p;
}

// The CUDA plugin when this build has one, else the CPU plugin.
const Plugin& device_plugin() {
  const Plugin& cuda = cuda_plugin_loaded();
  return cuda.api || ::access(cuda_plugin_path().c_str(), R_OK) == 0 ? cuda : cpu_plugin();
}

}  // namespace

const CkptTorchApi& require_torch_plugin(const char* purpose) {
  const Plugin& p = cpu_plugin();
  if (!p.api) fail(ErrorCode::kUnimplemented, p.error + " (needed for " + purpose + ")");
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
  info.cuda_compiled = p.api->cuda_compiled != 0;
  info.cuda_devices = p.api->cuda_device_count();
  info.cuda_available = info.cuda_devices > 0;
  return info;
}

}  // namespace ckpt
