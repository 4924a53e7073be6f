#include "io/parts_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace ckpt {
namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  fail(ErrorCode::kUnsafe, path + ": " + why +
                               "; a --part run's folder and files are its own, so this is refused: remove it and "
                               "rerun the parts");
}

// The folder's own checks, on the descriptor opened without following a link.
void check_folder(const std::string& path, int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(ErrorCode::kOutputFailed, path + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) refuse(path, "not a directory");
  if (st.st_uid != ::geteuid()) refuse(path, "owned by another user (uid " + std::to_string(st.st_uid) + ")");
}

int open_folder(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    if (errno == ELOOP || errno == ENOTDIR) {
      struct stat st {};
      bool link = ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
      refuse(path, link ? "a symbolic link" : "not a directory");
    }
    fail(ErrorCode::kOutputFailed, path + ": " + std::strerror(errno));
  }
  check_folder(path, fd);
  return fd;
}

}  // namespace

PartsFolder PartsFolder::create(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    fail(ErrorCode::kOutputFailed, path + ": cannot create the parts folder: " + std::strerror(errno));
  int fd = open_folder(path);
  if (fd < 0) fail(ErrorCode::kOutputFailed, path + ": the parts folder was removed while it was being made");
  return PartsFolder(path, fd);
}

std::optional<PartsFolder> PartsFolder::open(const std::string& path) {
  int fd = open_folder(path);
  if (fd < 0) return std::nullopt;
  return PartsFolder(path, fd);
}

PartsFolder::~PartsFolder() {
  if (fd_ >= 0) ::close(fd_);
}

PartsFolder::PartsFolder(PartsFolder&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

int PartsFolder::open_checked(const std::string& name, int flags) const {
  const std::string path = path_of(name);
  // O_NONBLOCK: a FIFO planted here must not block the open; it is refused below.
  int fd = ::openat(fd_, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    if (errno == ELOOP) refuse(path, "a symbolic link");
    if (errno == EISDIR || errno == ENXIO) refuse(path, "not a regular file");
    fail(ErrorCode::kOutputFailed, path + ": " + std::strerror(errno));
  }
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0)
    why = std::strerror(errno);
  else if (!S_ISREG(st.st_mode))
    why = "not a regular file";
  else if (st.st_uid != ::geteuid())
    why = "owned by another user (uid " + std::to_string(st.st_uid) + ")";
  else if (st.st_nlink != 1)  // a hard link to an input would be written through
    why = "a file with " + std::to_string(st.st_nlink) + " links (another name elsewhere)";
  if (!why.empty()) {
    ::close(fd);
    refuse(path, why);
  }
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    ::close(fd);
    fail(ErrorCode::kOutputFailed, path + ": " + std::strerror(errno));
  }
  return fd;
}

int PartsFolder::open_file(const std::string& name, bool create) const {
  return open_checked(name, O_RDWR | (create ? O_CREAT : 0));
}

std::optional<std::string> PartsFolder::read_file(const std::string& name) const {
  int fd = open_checked(name, O_RDONLY);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0) text.resize(static_cast<std::size_t>(st.st_size));
  std::size_t at = 0;
  while (at < text.size()) {
    ssize_t got = ::read(fd, text.data() + at, text.size() - at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    at += static_cast<std::size_t>(got);
  }
  ::close(fd);
  text.resize(at);
  return text;
}

void PartsFolder::replace_file(const std::string& name, const std::string& text) const {
  const std::string mine = name + "." + std::to_string(::getpid());
  int fd = open_file(mine, true);
  if (fd < 0) fail(ErrorCode::kOutputFailed, path_of(mine) + ": " + std::strerror(errno));
  bool ok = ::ftruncate(fd, 0) == 0;
  for (std::size_t at = 0; ok && at < text.size();) {
    ssize_t put = ::pwrite(fd, text.data() + at, text.size() - at, static_cast<off_t>(at));
    if (put < 0 && errno == EINTR) continue;
    ok = put > 0;
    if (ok) at += static_cast<std::size_t>(put);
  }
  int err = errno;
  ::close(fd);
  if (!ok) fail(ErrorCode::kOutputFailed, path_of(mine) + ": " + std::strerror(err));
  if (::renameat(fd_, mine.c_str(), fd_, name.c_str()) != 0)
    fail(ErrorCode::kOutputFailed, path_of(name) + ": " + std::strerror(errno));
}

bool PartsFolder::remove_file(const std::string& name) const { return ::unlinkat(fd_, name.c_str(), 0) == 0; }

bool PartsFolder::create_exclusive(const std::string& name) const {
  int fd = ::openat(fd_, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST || errno == ENOENT) return false;  // errno says which
    fail(ErrorCode::kOutputFailed, path_of(name) + ": " + std::strerror(errno));
  }
  ::close(fd);
  return true;
}

PartsFiles::PartsFiles(const PartsFolder& folder, const std::vector<std::string>& names, bool create,
                       const std::string& when_missing) {
  for (const auto& name : names) {
    int fd = folder.open_file(name, create);
    if (fd < 0) fail(ErrorCode::kDataLoss, folder.path_of(name) + when_missing);
    fds_.push_back(fd);
    paths_.push_back(folder.path_of(name));
  }
}

PartsFiles::~PartsFiles() {
  for (int fd : fds_) ::close(fd);
}

std::size_t PartsFiles::read_at(std::size_t k, uint64_t at, void* buf, std::size_t n, const std::string& what) const {
  for (;;) {
    ssize_t got = ::pread(fds_.at(k), buf, n, static_cast<off_t>(at));
    if (got >= 0) return static_cast<std::size_t>(got);
    if (errno != EINTR) fail(ErrorCode::kOutputFailed, paths_[k] + ": " + what + ": " + std::strerror(errno));
  }
}

void PartsFiles::set_length(std::size_t k, uint64_t length, bool durable) const {
  if (::ftruncate(fds_.at(k), static_cast<off_t>(length)) != 0 || (durable && ::fsync(fds_[k]) != 0))
    fail(ErrorCode::kOutputFailed, paths_[k] + ": " + std::strerror(errno));
}

void PartsFiles::sync_data(std::size_t k) const {
  if (::fdatasync(fds_.at(k)) != 0) fail(ErrorCode::kOutputFailed, paths_[k] + ": " + std::strerror(errno));
}

void PartsFiles::write_back(std::size_t k, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const {
  constexpr unsigned kWriteAndWait = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
  for (std::size_t i = 0; i < ranges.size();) {
    // Ranges less than kGap apart (one worker's consecutive tensors, the zip
    // headers the finalizer writes between them) as one call: a checkpoint
    // of 100,000 tensors is not 100,000 calls, and the gaps' pages are at
    // most kGap of another writer's bytes sent early.
    constexpr uint64_t kGap = uint64_t{1} << 20;
    uint64_t begin = ranges[i].first, end = ranges[i].second;
    for (++i; i < ranges.size() && ranges[i].first <= end + kGap; ++i) end = std::max(end, ranges[i].second);
    if (end <= begin) continue;
    if (::sync_file_range(fds_.at(k), static_cast<off64_t>(begin), static_cast<off64_t>(end - begin), kWriteAndWait) ==
        0)
      continue;
    if (errno == ENOSYS || errno == EINVAL || errno == ESPIPE) return sync_data(k);  // not supported here
    fail(ErrorCode::kOutputFailed, paths_[k] + ": " + std::strerror(errno));
  }
}

}  // namespace ckpt
