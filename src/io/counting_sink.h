// Sizing outputs without writing them: --dry-run runs the real writer
// against a CountingSink, with tensor data taken from a ZeroSource, so the
// sizes it prints are exact and no tensor byte is read.
#pragma once

#include <cstring>

#include "io/byte_sink.h"
#include "io/byte_source.h"

namespace ckpt {

// Counts what would be written; copies from sources cost nothing.
class CountingSink final : public ByteSink {
 public:
  using ByteSink::write;
  void write(const void*, std::size_t n) override { position_ += n; }
  uint64_t position() const override { return position_; }
  void copy_from(const ByteSource&, uint64_t, uint64_t n) override { position_ += n; }

 private:
  uint64_t position_ = 0;
};

// n zero bytes, never materialised (CountingSink does not read them).
class ZeroSource final : public ByteSource {
 public:
  explicit ZeroSource(uint64_t n) : n_(n) {}
  uint64_t size() const override { return n_; }
  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    std::memset(buf, 0, n);
  }
  std::string describe() const override { return "<zeros>"; }

 private:
  uint64_t n_;
};

}  // namespace ckpt
