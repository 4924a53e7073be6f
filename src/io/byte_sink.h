// Sequential output: an in-memory buffer for tests, or an atomic file that
// appears at its destination only when finish() succeeds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/byte_source.h"
#include "io/writeback.h"

namespace ckpt {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(const void* data, std::size_t n) = 0;
  virtual uint64_t position() const = 0;
  // Appends n bytes of `src` starting at pos. File sinks let the kernel move
  // the bytes (copy_file_range) when the source is a file; the default reads
  // through a bounded buffer.
  virtual void copy_from(const ByteSource& src, uint64_t pos, uint64_t n);
  // Moves past n bytes that another writer fills (a --part run's workers
  // each write their own ranges of one file: io/part_sink.h). Sinks that
  // write one stream cannot leave a gap: Internal error.
  virtual void skip(uint64_t n);

  void write(const std::string& s) { write(s.data(), s.size()); }
  void write_zeros(std::size_t n);
};

class MemorySink final : public ByteSink {
 public:
  using ByteSink::write;
  void write(const void* data, std::size_t n) override;
  uint64_t position() const override { return bytes_.size(); }
  const std::string& bytes() const { return bytes_; }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// Writes to "<dest>.tmp-XXXXXX" in the destination's folder; finish() flushes,
// fsyncs and renames onto dest. Destroyed unfinished, it removes the temp
// file and never throws. Errors are OutputFailed naming the destination.
class AtomicFileSink final : public ByteSink {
 public:
  // InvalidArgument if dest exists and !overwrite. `durable` fsyncs the
  // data before the rename (crash-safe on power loss); without it the rename
  // still makes the output appear whole or not at all to other processes.
  // `label` names the file in messages instead of `dest` (a staged file of
  // a larger output is named as the output will be).
  static std::unique_ptr<AtomicFileSink> create(const std::string& dest, bool overwrite, bool durable = true,
                                                std::string label = {});
  // A file of a larger output, made at `path` in a scratch folder that only
  // this run writes and that removes itself (exec/parted_output.h's
  // one-process run): no temporary name of its own, so no sweep of the
  // folder for stale ones. Finished with detach(); `label` names it in
  // messages. OutputFailed when it cannot be made.
  static std::unique_ptr<AtomicFileSink> create_staged(const std::string& path, bool durable, std::string label);
  ~AtomicFileSink() override;
  AtomicFileSink(const AtomicFileSink&) = delete;
  AtomicFileSink& operator=(const AtomicFileSink&) = delete;

  using ByteSink::write;
  void write(const void* data, std::size_t n) override;
  uint64_t position() const override { return position_; }
  void copy_from(const ByteSource& src, uint64_t pos, uint64_t n) override;
  // complete() + publish(), stopping between them when the job was
  // interrupted: the output appears whole or not at all.
  void finish();
  // The data written and synced (with `durable`); the temporary file stays
  // open and locked, and unpublished. For outputs of several files, which
  // are all completed before any is published.
  void complete();
  // Renames the completed temporary file into place.
  void publish();
  // Completes the file and hands it over unpublished: it stays at
  // temp_path(), closed, and this sink no longer removes it (a staged file,
  // which the caller renames into place).
  const std::string& detach();

  const std::string& destination() const { return dest_; }
  const std::string& temp_path() const { return temp_; }

 private:
  AtomicFileSink(std::string dest, std::string temp, int fd, bool overwrite, bool durable, std::string label);
  void close_file();
  void flush_buffer();
  void write_fully(const void* data, std::size_t n);
  [[noreturn]] void fail_io(const std::string& what, int err) const;

  std::string dest_;
  std::string temp_;
  std::string label_;  // for messages
  int fd_;
  bool overwrite_;
  bool durable_;
  bool completed_ = false;
  bool finished_ = false;
  uint64_t position_ = 0;
  std::optional<Writeback> writeback_;  // with `durable`: the file streams to the disk as written
  std::vector<char> buffer_;
};

}  // namespace ckpt
