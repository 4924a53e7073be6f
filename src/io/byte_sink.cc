#include "io/byte_sink.h"
#include "io/mapped_inputs.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/interrupt.h"
#include "io/atomic_dir.h"
#include "io/temp_output.h"
#include "io/writeback.h"

namespace ckpt {
namespace {
constexpr std::size_t kCopyChunk = 4u << 20;    // bounded buffer for read-through copies
constexpr std::size_t kWriteBuffer = 1u << 20;  // coalesces small writes (headers, pickles)
}  // namespace

void ByteSink::copy_from(const ByteSource& src, uint64_t pos, uint64_t n) {
  if (const std::byte* p = src.data()) {
    if (pos > src.size() || n > src.size() - pos) fail_data_loss(src.describe() + ": copy range past the end");
    // In steps, each released once written: pages read through a mapping
    // count in our RSS, and a tensor of gigabytes must not hold them all.
    while (n > 0) {
      std::size_t step = static_cast<std::size_t>(std::min<uint64_t>(n, kCopyChunk));
      write(p + pos, step);
      src.release(pos, step);
      pos += step;
      n -= step;
    }
    return;
  }
  std::vector<char> buf(static_cast<std::size_t>(std::min<uint64_t>(n, kCopyChunk)));
  while (n > 0) {
    std::size_t step = static_cast<std::size_t>(std::min<uint64_t>(n, buf.size()));
    src.read(pos, buf.data(), step);
    write(buf.data(), step);
    pos += step;
    n -= step;
  }
}

void ByteSink::skip(uint64_t n) {
  fail(ErrorCode::kInternal, "this output cannot leave a gap of " + std::to_string(n) + " bytes for another writer");
}

void ByteSink::write_zeros(std::size_t n) {
  static const char kZeros[256] = {};
  while (n > 0) {
    std::size_t step = std::min(n, sizeof(kZeros));
    write(kZeros, step);
    n -= step;
  }
}

void MemorySink::write(const void* data, std::size_t n) { bytes_.append(static_cast<const char*>(data), n); }

std::unique_ptr<AtomicFileSink> AtomicFileSink::create(const std::string& dest, bool overwrite, bool durable,
                                                       std::string label) {
  struct stat st {};
  if (!overwrite && ::lstat(dest.c_str(), &st) == 0) fail_invalid(dest + ": output exists (use --force to overwrite)");
  remove_stale_temps(dest);
  std::string pattern = temp_prefix(dest) + "XXXXXX";
  std::vector<char> name;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    name.assign(pattern.begin(), pattern.end());
    name.push_back('\0');
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd < 0) fail(ErrorCode::kOutputFailed, cannot_create_temp(dest, errno));
    if (!lock_new_temp(fd, name.data())) {  // removed by a concurrent cleaner: make another
      ::close(fd);
      fd = -1;
      if (attempt == 8) fail(ErrorCode::kOutputFailed, dest + ": cannot keep a temporary file (removed as made)");
    }
  }
  ::fchmod(fd, 0644);  // mkostemp makes 0600; outputs should look like any other file
  if (label.empty()) label = dest;
  return std::unique_ptr<AtomicFileSink>(
      new AtomicFileSink(dest, name.data(), fd, overwrite, durable, std::move(label)));
}

std::unique_ptr<AtomicFileSink> AtomicFileSink::create_staged(const std::string& path, bool durable,
                                                              std::string label) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) fail(ErrorCode::kOutputFailed, label + ": cannot create " + path + ": " + std::strerror(errno));
  ::fchmod(fd, 0644);  // as create() makes them, whatever the umask
  return std::unique_ptr<AtomicFileSink>(new AtomicFileSink(path, path, fd, false, durable, std::move(label)));
}

AtomicFileSink::AtomicFileSink(std::string dest, std::string temp, int fd, bool overwrite, bool durable,
                               std::string label)
    : dest_(std::move(dest)),
      temp_(std::move(temp)),
      label_(std::move(label)),
      fd_(fd),
      overwrite_(overwrite),
      durable_(durable) {
  buffer_.reserve(kWriteBuffer);
  // --no-fsync: the page cache absorbs the output, as the user asked.
  if (durable_) writeback_.emplace(fd_);
}

AtomicFileSink::~AtomicFileSink() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(temp_.c_str());
}

void AtomicFileSink::fail_io(const std::string& what, int err) const {
  fail(ErrorCode::kOutputFailed, label_ + ": " + what + ": " + std::strerror(err));
}

void AtomicFileSink::write_fully(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t put = ::write(fd_, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) {
      check_write_source(p, errno);  // a truncated input, not this output
      fail_io("write failed", errno);
    }
    if (writeback_) writeback_->appended(static_cast<uint64_t>(put));
    p += put;
    n -= static_cast<std::size_t>(put);
  }
}

void AtomicFileSink::flush_buffer() {
  if (buffer_.empty()) return;
  write_fully(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFileSink::write(const void* data, std::size_t n) {
  if (finished_) fail(ErrorCode::kInternal, label_ + ": write after finish");
  if (buffer_.size() + n > kWriteBuffer) {
    flush_buffer();
    if (n >= kWriteBuffer) {
      write_fully(data, n);
      position_ += n;
      return;
    }
  }
  buffer_.insert(buffer_.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
  position_ += n;
}

void AtomicFileSink::copy_from(const ByteSource& src, uint64_t pos, uint64_t n) {
  auto span = src.file_span(pos);
  if (!span || n < kWriteBuffer) {
    ByteSink::copy_from(src, pos, n);
    return;
  }
  if (pos > src.size() || n > src.size() - pos) fail_data_loss(src.describe() + ": copy range past the end");
  flush_buffer();
  loff_t in_off = static_cast<loff_t>(span->offset);
  uint64_t left = n;
  while (left > 0) {
    // At most a writeback window per call, so the output streams out as it grows.
    ssize_t moved = ::copy_file_range(span->fd, &in_off, fd_, nullptr, std::min(left, Writeback::kWritebackWindow), 0);
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) {
      // Not supported here (other file system, old kernel): copy the rest through user space.
      ByteSink::copy_from(src, pos + (n - left), left);
      return;
    }
    if (writeback_) writeback_->appended(static_cast<uint64_t>(moved));
    left -= static_cast<uint64_t>(moved);
    position_ += static_cast<uint64_t>(moved);
  }
}

void AtomicFileSink::finish() {
  if (finished_) return;
  complete();
  check_interrupted();  // an interrupted job leaves nothing, even when this file is done
  publish();
}

void AtomicFileSink::complete() {
  if (completed_) return;
  flush_buffer();
  if (durable_ && ::fsync(fd_) != 0) fail_io("fsync failed", errno);
  completed_ = true;
}

void AtomicFileSink::close_file() {
  complete();
  std::vector<char>().swap(buffer_);  // a closed file keeps no write buffer (a run may hold thousands of them)
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_io("close failed", errno);
}

void AtomicFileSink::publish() {
  if (finished_) return;
  close_file();
  rename_into_place(temp_, dest_, overwrite_);
  finished_ = true;
  if (durable_) sync_directory_of(dest_);
}

const std::string& AtomicFileSink::detach() {
  if (!finished_) {
    close_file();
    finished_ = true;
  }
  return temp_;
}

}  // namespace ckpt
