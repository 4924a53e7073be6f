#include "io/atomic_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

AtomicDirectory::AtomicDirectory(std::string dir, bool force) : dir_(std::move(dir)), force_(force) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (!force_ && path_exists(dir_)) fail_invalid(dir_ + ": output exists (use --force to overwrite)");
  std::string pattern = dir_ + ".tmp-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  if (::mkdtemp(name.data()) == nullptr)
    fail(ErrorCode::kOutputFailed, dir_ + ": cannot create temporary directory: " + std::strerror(errno));
  temp_ = name.data();
  ::chmod(temp_.c_str(), 0755);  // mkdtemp makes 0700
}

AtomicDirectory::~AtomicDirectory() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

std::string AtomicDirectory::path_of(const std::string& name) const { return (fs::path(temp_) / name).string(); }

void AtomicDirectory::commit() {
  if (int dfd = ::open(temp_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_NOREPLACE) == 0) {
    committed_ = true;
    return;
  }
  int err = errno;
  if (err != EEXIST || !force_) {
    if (err == EEXIST) fail_invalid(dir_ + ": output exists (use --force to overwrite)");
    fail(ErrorCode::kOutputFailed, dir_ + ": cannot rename temporary directory into place: " + std::strerror(err));
  }
  // --force over an existing output: swap atomically, then remove the old one
  // (now at the temporary name).
  if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) != 0)
    fail(ErrorCode::kOutputFailed, dir_ + ": cannot replace the existing output: " + std::strerror(errno));
  committed_ = true;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

}  // namespace ckpt
