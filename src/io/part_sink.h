// The sink of one process of a --part run (exec/parted_output.h): every
// worker runs the same writer over the whole output, and this sink puts
// only the bytes inside its ranges into the shared file (positional writes,
// copy_file_range for unchanged source bytes), skipping the rest. Without a
// file (fd < 0) it only counts: the layout pass that finds where each
// tensor's bytes go. The HDF5 writer uses one to fill a dataset's extent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/byte_sink.h"
#include "io/writeback.h"

namespace ckpt {

class PartSink final : public ByteSink {
 public:
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;  // [begin, end), sorted, disjoint

  // `start`: the file offset of the first byte written through the sink
  // (its position() counts from there). `stream`: a durable output, whose
  // ranges go to the disk as they are written (io/writeback.h).
  PartSink(int fd, Ranges ranges, std::string what, uint64_t start = 0, bool stream = false);

  using ByteSink::write;
  void write(const void* data, std::size_t n) override;
  uint64_t position() const override { return position_; }
  void copy_from(const ByteSource& src, uint64_t pos, uint64_t n) override;
  void skip(uint64_t n) override { position_ += n; }

 private:
  // Calls fn(offset into the call, length) for each piece of [position_,
  // position_ + n) inside the ranges.
  template <typename Fn>
  void for_each_owned(uint64_t n, Fn&& fn) const;
  void pwrite_fully(const void* data, std::size_t n, uint64_t at);

  int fd_;
  Ranges ranges_;
  std::string what_;
  uint64_t position_ = 0;
  std::optional<Writeback> writeback_;
};

}  // namespace ckpt
