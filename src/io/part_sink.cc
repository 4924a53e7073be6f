#include "io/part_sink.h"
#include "io/mapped_inputs.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace ckpt {

PartSink::PartSink(int fd, Ranges ranges, std::string what, uint64_t start, bool stream)
    : fd_(fd), ranges_(std::move(ranges)), what_(std::move(what)), position_(start) {
  if (stream && fd_ >= 0) writeback_.emplace(fd_);
}

template <typename Fn>
void PartSink::for_each_owned(uint64_t n, Fn&& fn) const {
  const uint64_t begin = position_, end = position_ + n;
  // The first range that ends after `begin`.
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), begin,
                             [](uint64_t at, const std::pair<uint64_t, uint64_t>& r) { return at < r.second; });
  for (; it != ranges_.end() && it->first < end; ++it) {
    uint64_t lo = std::max(begin, it->first), hi = std::min(end, it->second);
    if (lo < hi) fn(lo - begin, hi - lo);
  }
}

void PartSink::pwrite_fully(const void* data, std::size_t n, uint64_t at) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t put = ::pwrite(fd_, p, n, static_cast<off_t>(at));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      if (put < 0) check_write_source(p, errno);  // a truncated input, not this output
      fail(ErrorCode::kOutputFailed, what_ + ": write failed: " + std::strerror(errno));
    }
    if (writeback_) writeback_->wrote(at, static_cast<uint64_t>(put));
    p += put;
    at += static_cast<uint64_t>(put);
    n -= static_cast<std::size_t>(put);
  }
}

void PartSink::write(const void* data, std::size_t n) {
  if (fd_ >= 0)
    for_each_owned(n, [&](uint64_t off, uint64_t len) {
      pwrite_fully(static_cast<const char*>(data) + off, static_cast<std::size_t>(len), position_ + off);
    });
  position_ += n;
}

void PartSink::copy_from(const ByteSource& src, uint64_t pos, uint64_t n) {
  if (pos > src.size() || n > src.size() - pos) fail_data_loss(src.describe() + ": copy range past the end");
  if (fd_ >= 0)
    for_each_owned(n, [&](uint64_t off, uint64_t len) {
      uint64_t done = 0;
      if (auto span = src.file_span(pos + off)) {
        loff_t in = static_cast<loff_t>(span->offset), out = static_cast<loff_t>(position_ + off);
        while (done < len) {
          // At most a writeback window per call, so a streamed output goes out as it grows.
          ssize_t moved =
              ::copy_file_range(span->fd, &in, fd_, &out, std::min(len - done, Writeback::kWritebackWindow), 0);
          if (moved < 0 && errno == EINTR) continue;
          if (moved <= 0) break;  // not supported here: the rest through a buffer
          if (writeback_) writeback_->wrote(position_ + off + done, static_cast<uint64_t>(moved));
          done += static_cast<uint64_t>(moved);
        }
      }
      std::vector<char> buf(static_cast<std::size_t>(std::min<uint64_t>(len - done, 8u << 20)));
      while (done < len) {
        auto step = static_cast<std::size_t>(std::min<uint64_t>(len - done, buf.size()));
        src.read_unmapped(pos + off + done, buf.data(), step);
        pwrite_fully(buf.data(), step, position_ + off + done);
        done += step;
      }
    });
  position_ += n;
}

}  // namespace ckpt
