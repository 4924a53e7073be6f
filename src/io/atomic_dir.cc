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
#include "core/interrupt.h"
#include "core/log.h"
#include "core/paths.h"
#include "io/byte_source.h"
#include "io/temp_output.h"

namespace ckpt {

SideFile read_side_file(const std::string& path) {
  SourcePtr from = open_file_source(path);
  return {file_name(path), from->read_string(0, static_cast<std::size_t>(from->size()))};
}

namespace {

namespace fs = std::filesystem;

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

std::string without_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

void sync_directory_of(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  std::string dir = parent.empty() ? "." : parent.string();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // EINVAL: a file system that cannot sync a directory (some FUSE mounts);
  // nothing more can be done there.
  if (fd < 0 || (::fsync(fd) != 0 && errno != EINVAL))
    log::warn(dir + ": cannot fsync the directory holding the output (" + std::strerror(errno) +
              "); it is in place, but a power loss now could undo its rename");
  if (fd >= 0) ::close(fd);
}

void rename_into_place(const std::string& from, const std::string& to, bool overwrite) {
  unsigned flags = overwrite ? 0 : RENAME_NOREPLACE;
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags) == 0) return;
  int err = errno;
  if (err == EEXIST) fail_invalid(to + ": output exists (use --force to overwrite)");
  fail(ErrorCode::kOutputFailed, to + ": cannot rename the finished output into place: " + std::strerror(err));
}

AtomicDirectory::AtomicDirectory(std::string dir, bool force, bool durable)
    : dir_(without_trailing_slashes(std::move(dir))), force_(force), durable_(durable) {
  if (!force_ && path_exists(dir_)) fail_invalid(dir_ + ": output exists (use --force to overwrite)");
  remove_stale_temps(dir_);
  std::string pattern = temp_prefix(dir_) + "XXXXXX";
  for (int attempt = 0; lock_fd_ < 0; ++attempt) {
    std::vector<char> name(pattern.begin(), pattern.end());
    name.push_back('\0');
    if (::mkdtemp(name.data()) == nullptr) fail(ErrorCode::kOutputFailed, cannot_create_temp(dir_, errno));
    temp_ = name.data();
    lock_fd_ = ::open(temp_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock_fd_ >= 0 && !lock_new_temp(lock_fd_, temp_)) {  // removed by a concurrent cleaner
      ::close(lock_fd_);
      lock_fd_ = -1;
    }
    if (lock_fd_ < 0 && attempt == 8)
      fail(ErrorCode::kOutputFailed, dir_ + ": cannot keep a temporary directory (removed as made)");
  }
  ::chmod(temp_.c_str(), 0755);  // mkdtemp makes 0700
}

AtomicDirectory::~AtomicDirectory() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string AtomicDirectory::path_of(const std::string& name) const { return (fs::path(temp_) / name).string(); }

void AtomicDirectory::commit() {
  check_interrupted();  // an interrupted job leaves nothing, even when its files are done
  if (durable_) {
    if (int dfd = ::open(temp_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_NOREPLACE) == 0) {
    committed_ = true;
    if (durable_) sync_directory_of(dir_);
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
  if (durable_) sync_directory_of(dir_);
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

}  // namespace ckpt
