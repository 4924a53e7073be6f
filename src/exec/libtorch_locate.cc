#include "exec/libtorch_locate.h"

#include <dlfcn.h>
#include <glob.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/linear_regex.h"

namespace ckpt {
namespace {

std::string executable_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<std::size_t>(n));
  return path.substr(0, path.rfind('/'));
}

bool readable(const std::string& path) { return ::access(path.c_str(), R_OK) == 0; }

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// "2.15.0" of "2.15.0+cu132": the part the C++ ABI follows.
std::string release_of(const std::string& version) { return version.substr(0, version.find('+')); }

// The torch version of a wheel's lib folder, from torch/version.py beside
// it; empty when there is none (a plain LibTorch zip).
std::string wheel_version(const std::string& lib_dir) {
  std::ifstream in(lib_dir + "/../version.py");
  static const LinearRegex re = LinearRegex::compile(R"(^__version__\s*=\s*'([^']+)')");
  std::string line;
  RegexMatch m;
  while (std::getline(in, line))
    if (re.search(line, m)) return m.str(1);
  return "";
}

// The site-packages torch/lib folders of a Python environment's prefix.
std::vector<std::string> env_torch_libs(const std::string& prefix) {
  std::vector<std::string> out;
  glob_t g{};
  std::string pattern = prefix + "/lib/python3*/site-packages/torch/lib";
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (out.empty()) out.push_back(pattern);  // named in the message as searched
  return out;
}

}  // namespace

std::string find_plugin(const std::string& file, std::vector<std::string>* searched) {
  std::string exe = executable_dir();
  for (const std::string& dir : {exe, exe + "/../lib/ckptconv"}) {
    std::string path = dir + "/" + file;
    if (searched) searched->push_back(path);
    if (readable(path)) return path;
  }
  return "";
}

LibTorchLocation locate_libtorch() {
  LibTorchLocation out;
  const std::string built = release_of(CKPT_BUILD_TORCH_VERSION);
  auto consider = [&](std::string dir, const std::string& by) {
    if (!readable(dir + "/libtorch_cpu.so") && readable(dir + "/lib/libtorch_cpu.so")) dir += "/lib";
    if (!readable(dir + "/libtorch_cpu.so")) {
      out.searched.push_back(dir + ": no libtorch_cpu.so (" + by + ")");
      return false;
    }
    std::string version = wheel_version(dir);
    if (!version.empty() && release_of(version) != built) {
      out.searched.push_back(dir + ": torch " + version + ", but this ckptconv was built with " + built + " (" + by +
                             ")");
      return false;
    }
    out.dir = dir;
    out.found_by = by;
    return true;
  };
  if (std::string e = env("CKPTCONV_LIBTORCH"); !e.empty() && consider(e, "CKPTCONV_LIBTORCH")) return out;
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (std::string prefix = env(var); !prefix.empty())
      for (const auto& dir : env_torch_libs(prefix))
        if (consider(dir, std::string("the active Python environment ($") + var + ")")) return out;
  consider(CKPT_BUILD_LIBTORCH_DIR, "the build's own LibTorch");
  return out;
}

std::string preload_libtorch(const std::string& dir, bool cuda) {
  std::vector<std::string> libs = {"libc10.so", "libtorch_cpu.so"};
  if (cuda) libs.insert(libs.end(), {"libc10_cuda.so", "libtorch_cuda.so", "libtorch.so"});
  for (const auto& lib : libs) {
    std::string path = dir + "/" + lib;
    if (!readable(path)) {
      if (lib == "libc10.so" || lib == "libtorch_cpu.so") return path + ": not readable";
      continue;  // a CPU-only LibTorch: the CUDA plugin then fails to load, and says why
    }
    if (!::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      const char* why = ::dlerror();
      return path + ": " + (why ? why : "cannot load");
    }
  }
  return "";
}

const char* build_torch_version() { return CKPT_BUILD_TORCH_VERSION; }

}  // namespace ckpt
