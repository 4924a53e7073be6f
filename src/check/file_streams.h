// validate --manifest's whole-file checksums, summed from the bytes the
// tensor scan reads anyway, so each byte of a checkpoint is read once: the
// scan's workers hand every slice they read from a file (feed) to that
// file's stream, which hashes it when it is next in file order. A worker
// whose slice is ahead of the stream while another worker is reading the
// bytes before it (announced with Reading) waits for them: in a DCP
// directory two workers on consecutive tensors then move through the rank
// files one file apart. Bytes no scan reads (zip headers, pickles,
// non-tensor items) are read by the stream itself when it reaches them; a
// slice ahead of bytes nobody is reading yet is held in a bounded buffer or
// dropped; whatever is still missing at the end (dropped slices, files no
// tensor lives in: .metadata) is read by finish(). The checksum is always
// of the file's bytes in order (what xxhsum or sha256sum print); only where
// the bytes come from changes. Waits only go from a later offset to an
// earlier one in the same file, so they cannot form a cycle (and are
// bounded by a timeout all the same).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/problems.h"
#include "exec/checksum.h"
#include "io/byte_source.h"
#include "model/checkpoint_model.h"

namespace ckpt::check {

class FileStreams {
  struct Stream;

 public:
  // `files` in the manifest's order; `budget`: bytes of early slices held.
  FileStreams(const std::vector<std::string>& files, ChecksumAlgorithm algorithm, const CheckpointModel& model,
              uint64_t budget);
  ~FileStreams();
  FileStreams(const FileStreams&) = delete;
  FileStreams& operator=(const FileStreams&) = delete;

  // While alive: a scan is reading bytes [offset, offset + n) of the file
  // `at` is in (at.offset is where), and will feed them in order.
  class Reading {
   public:
    Reading(FileStreams& streams, const FileSpan& at, uint64_t n);
    ~Reading();
    Reading(const Reading&) = delete;
    Reading& operator=(const Reading&) = delete;

   private:
    Stream* stream_ = nullptr;
    uint64_t id_ = 0;
  };

  // Bytes [at.offset, at.offset + n) of the file `at` is in, as a scan read
  // them. Never throws: a file it cannot follow is read again by finish().
  void feed(const FileSpan& at, const std::byte* data, std::size_t n) noexcept;

  // Completes files one at a time until none is left; several threads may
  // call it at once. A file that cannot be read is reported to `problems`
  // (a sink per caller). Then checksum(k) is file k's digest.
  void finish(ProblemSink& problems);
  const std::string& checksum(std::size_t k) const;
  uint64_t size(std::size_t k) const;
  // The index in `files` of the file `chunk`'s bytes are in: by the file's
  // identity where its storage reads a file directly, else by the path it
  // names (a compressed item); nullopt when it is none of them.
  std::optional<std::size_t> file_of(const TensorChunk& chunk) const;

 private:
  Stream* stream_of(const FileSpan& at);
  bool others_reading_before(const Stream& s, uint64_t offset) const;
  void advance(Stream& s, uint64_t offset, const std::byte* data, std::size_t n);
  void drain(Stream& s);
  bool read_gap(Stream& s, uint64_t to, bool anything);
  void complete(Stream& s);

  std::vector<std::unique_ptr<Stream>> streams_;
  std::map<std::pair<uint64_t, uint64_t>, Stream*> by_inode_;  // (device, inode)
  std::atomic<std::size_t> next_to_finish_{0};
  std::mutex budget_mutex_;
  uint64_t budget_;
  uint64_t held_ = 0;
  std::atomic<uint64_t> next_reading_{1};
};

}  // namespace ckpt::check
