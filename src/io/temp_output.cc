#include "io/temp_output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/log.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kRandomChars = 6;  // mkstemp's XXXXXX

bool same_file(int fd, const std::string& path) {
  struct stat a {
  }, b{};
  return ::fstat(fd, &a) == 0 && ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

constexpr std::size_t kNameMax = 255;  // NAME_MAX of Linux file systems

// FNV-1a 64: stable across runs and builds, unlike std::hash.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::string temp_prefix(const std::string& dest) {
  fs::path d(dest);
  std::string name = d.filename().string();
  static const std::string kSuffix = ".tmp-";
  if (name.size() + kSuffix.size() + kRandomChars > kNameMax) {
    char hash[20];
    std::snprintf(hash, sizeof hash, "~%016llx", static_cast<unsigned long long>(fnv1a(name)));
    name = name.substr(0, kNameMax - kSuffix.size() - kRandomChars - 17) + hash;
  }
  return (d.has_parent_path() ? (d.parent_path() / name).string() : name) + kSuffix;
}

bool lock_new_temp(int fd, const std::string& path) {
  // Non-blocking: a cleaner holding the lock is about to remove the entry.
  // After the lock, the name must still be this file (not removed and made
  // again by someone else in between).
  return ::flock(fd, LOCK_EX | LOCK_NB) == 0 && same_file(fd, path);
}

void remove_stale_temps(const std::string& dest) {
  fs::path d(dest);
  fs::path parent = d.has_parent_path() ? d.parent_path() : fs::path(".");
  std::string prefix = fs::path(temp_prefix(dest)).filename().string();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    std::string name = entry.path().filename().string();
    if (name.size() != prefix.size() + kRandomChars || name.compare(0, prefix.size(), prefix) != 0) continue;
    std::string path = entry.path().string();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && same_file(fd, path)) {
      std::error_code rm;
      fs::remove_all(path, rm);
      if (!rm) log::info("removed " + path + ", the temporary output of an earlier run that was killed");
    }
    ::close(fd);
  }
}

std::string cannot_create_temp(const std::string& dest, int err) {
  const std::string parent = std::filesystem::path(dest).parent_path().string();
  const std::string dir = parent.empty() ? std::string(".") : parent;
  std::string what = dest + ": cannot create the temporary output in " + dir + ": ";
  if (err == EROFS) return what + dir + " is on a read-only filesystem; write the output elsewhere (-o)";
  if (err == EACCES || err == EPERM)
    return what + "this user may not write in " + dir + " (" + std::strerror(err) +
           "); write the output elsewhere (-o) or change the directory's permissions";
  return what + std::strerror(err);
}

}  // namespace ckpt
