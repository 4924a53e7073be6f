// --memory-limit: the bytes of tensor buffers one job holds at once, and the
// share each of its consumers takes, so that together they never hold more.
// Jobs make one from the option (jobs::settle) and hand each consumer its
// share; no consumer divides the limit itself.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ckpt {

class MemoryBudget {
 public:
  static constexpr uint64_t kDefault = uint64_t{256} << 20;    // --memory-limit's default, 256M
  static constexpr uint64_t kWorkerFloor = uint64_t{1} << 20;  // below this a scan worker's slabs are all overhead

  explicit MemoryBudget(uint64_t total = kDefault) : total_(total) {}
  uint64_t total() const { return total_; }

  // consolidate, convert, reshard: every slab the copy engine has in flight
  // (exec/tensor_copy): one tensor is copied at a time.
  uint64_t copy() const { return total_; }
  // An s3:// source's read-ahead (io/s3_storage.h): GETs on the wire or
  // fetched ahead of their reader, for all the objects read at once.
  uint64_t read_ahead() const { return total_ / 4; }
  // diff: the row slabs of both tensors together.
  uint64_t diff() const { return total_; }
  // validate with whole-file checksums: a quarter for the checksum streams'
  // read-ahead (check/file_streams)...
  uint64_t file_streams() const { return total_ / 4; }
  // ...and the rest (all of it without streams) split among the scan
  // workers running at once, each at least kWorkerFloor (so a limit below
  // workers x 1 MiB is exceeded by that floor, never more).
  uint64_t scan_worker(int workers, bool with_streams) const {
    uint64_t shared = with_streams ? total_ - file_streams() : total_;
    return std::max<uint64_t>(shared / static_cast<uint64_t>(std::max(workers, 1)), kWorkerFloor);
  }
  // validate's second scan of a tensor found non-finite, chunk by chunk,
  // after the workers are done: all of it.
  uint64_t rescan() const { return total_; }

 private:
  uint64_t total_;
};

}  // namespace ckpt
