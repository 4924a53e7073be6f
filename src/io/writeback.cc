#include "io/writeback.h"

#include <fcntl.h>

namespace ckpt {

void Writeback::start(uint64_t begin, uint64_t end) {
  ::sync_file_range(fd_, static_cast<off64_t>(begin), static_cast<off64_t>(end - begin), SYNC_FILE_RANGE_WRITE);
  in_flight_.emplace_back(begin, end);
  in_flight_bytes_ += end - begin;
  while (in_flight_bytes_ > kWindowsInFlight * kWritebackWindow) {
    auto [b, e] = in_flight_.front();
    in_flight_.pop_front();
    in_flight_bytes_ -= e - b;
    ::sync_file_range(fd_, static_cast<off64_t>(b), static_cast<off64_t>(e - b),
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::posix_fadvise(fd_, static_cast<off_t>(b), static_cast<off_t>(e - b), POSIX_FADV_DONTNEED);
  }
}

void Writeback::wrote(uint64_t offset, uint64_t n) {
  if (n == 0) return;
  if (offset != end_) {  // a new run (a --part worker's next range): send what is left of the last one
    if (end_ > started_) start(started_, end_);
    started_ = offset;
  }
  end_ = offset + n;
  while (end_ - started_ >= kWritebackWindow) {
    start(started_, started_ + kWritebackWindow);
    started_ += kWritebackWindow;
  }
}

}  // namespace ckpt
