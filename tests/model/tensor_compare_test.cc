#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "model/tensor_compare.h"

#include "io/byte_source.h"

using namespace ckpt;

namespace {

constexpr int64_t kRows = 600, kCols = 1000;  // 2.4 MB of float32: three 1 MiB blocks of rows

float value_at(int64_t r, int64_t c) { return float(r * kCols + c) * 0.5f; }

// The largest read any source of a test made: a comparison's memory is its
// reads' (two blocks of rows), whatever the tensors' size.
std::size_t largest_read = 0;

class CountingSource : public ByteSource {
 public:
  explicit CountingSource(SourcePtr inner) : inner_(std::move(inner)) {}
  uint64_t size() const override { return inner_->size(); }
  void read(uint64_t pos, void* buf, std::size_t n) const override {
    largest_read = std::max(largest_read, n);
    inner_->read(pos, buf, n);
  }
  std::string describe() const override { return inner_->describe(); }

 private:
  SourcePtr inner_;
};

SourcePtr floats_source(const std::vector<float>& v) {
  return std::make_shared<CountingSource>(
      make_memory_source(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float))));
}

TensorEntry empty_tensor() {
  TensorEntry t;
  t.name = std::string("t");  // not = "t": GCC 12's -Wrestrict false positive on assigning a literal
  t.dtype = DType::kFloat32;
  t.shape = {kRows, kCols};
  return t;
}

// One chunk per block of rows, each its own storage, row-major.
TensorEntry by_rows(int64_t rows_per_chunk) {
  TensorEntry t = empty_tensor();
  for (int64_t r0 = 0; r0 < kRows; r0 += rows_per_chunk) {
    const int64_t n = std::min(rows_per_chunk, kRows - r0);
    std::vector<float> v;
    for (int64_t r = r0; r < r0 + n; ++r)
      for (int64_t c = 0; c < kCols; ++c) v.push_back(value_at(r, c));
    TensorChunk ch;
    ch.offsets = {r0, 0};
    ch.sizes = {n, kCols};
    ch.strides = {kCols, 1};
    ch.storage = floats_source(v);
    t.chunks.push_back(ch);
  }
  return t;
}

// Two chunks of columns, each stored transposed (column-major): a run along
// the last dimension is not adjacent in storage.
TensorEntry by_transposed_columns() {
  TensorEntry t = empty_tensor();
  for (int64_t c0 : {int64_t{0}, kCols / 2}) {
    const int64_t n = kCols / 2;
    std::vector<float> v;
    for (int64_t c = c0; c < c0 + n; ++c)
      for (int64_t r = 0; r < kRows; ++r) v.push_back(value_at(r, c));
    TensorChunk ch;
    ch.offsets = {0, c0};
    ch.sizes = {kRows, n};
    ch.strides = {1, kRows};
    ch.storage = floats_source(v);
    t.chunks.push_back(ch);
  }
  return t;
}

}  // namespace

TEST_CASE("same_tensor_values compares any chunking block by block", "[model][compare]") {
  const TensorEntry one = by_rows(kRows), rows = by_rows(7), cols = by_transposed_columns();
  largest_read = 0;
  CHECK(same_tensor_values(one, rows));
  CHECK(largest_read <= (std::size_t{1} << 20));  // a block of rows at a time, not the 2.4 MB tensor
  CHECK(same_tensor_values(rows, cols));
  CHECK(same_tensor_values(cols, one));
  // One element changed in the last block of rows: found.
  TensorEntry changed = by_rows(kRows);
  std::vector<float> v;
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c) v.push_back(value_at(r, c));
  v[(kRows - 1) * kCols + 3] += 1.0f;
  changed.chunks[0].storage = floats_source(v);
  CHECK_FALSE(same_tensor_values(changed, cols));
  CHECK_FALSE(same_tensor_values(cols, changed));
  // A row no chunk covers reads as zeros, so it differs from stored values.
  TensorEntry gap = by_rows(100);
  gap.chunks.erase(gap.chunks.begin() + 3);
  CHECK_FALSE(same_tensor_values(gap, one));
}
