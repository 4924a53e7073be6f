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

  // `reads_ahead`: the job reads an s3:// source, whose read-ahead takes a
  // quarter of the limit; the shares below are then the rest.
  explicit MemoryBudget(uint64_t total = kDefault, bool reads_ahead = false)
      : total_(total), reads_ahead_(reads_ahead) {}
  uint64_t total() const { return total_; }

  // An s3:// source's read-ahead (io/s3_storage.h): GETs on the wire or
  // fetched ahead of their reader, for all the objects read at once.
  uint64_t read_ahead() const { return reads_ahead_ ? total_ / 4 : 0; }
  // consolidate, convert, reshard: every slab the copy engine has in flight
  // (exec/tensor_copy): one tensor is copied at a time. An s3:// output's
  // part buffers come out of it too (exec/parted_output).
  uint64_t copy() const { return total_ - read_ahead(); }
  // diff: the row slabs of both tensors together.
  uint64_t diff() const { return total_ - read_ahead(); }
  // validate with whole-file checksums: a quarter for the checksum streams'
  // read-ahead (check/file_streams)...
  uint64_t file_streams() const { return total_ / 4; }
  // ...and the rest (all of it without streams) split among the scan
  // workers running at once, each at least kWorkerFloor (so a limit below
  // workers x 1 MiB is exceeded by that floor, never more).
  uint64_t scan_worker(int workers, bool with_streams) const {
    uint64_t shared = total_ - read_ahead() - (with_streams ? file_streams() : 0);
    return std::max<uint64_t>(shared / static_cast<uint64_t>(std::max(workers, 1)), kWorkerFloor);
  }
  // validate's second scan of a tensor found non-finite, chunk by chunk,
  // after the workers are done: all of it (but the read-ahead).
  uint64_t rescan() const { return total_ - read_ahead(); }

 private:
  uint64_t total_;
  bool reads_ahead_;
};

}  // namespace ckpt
