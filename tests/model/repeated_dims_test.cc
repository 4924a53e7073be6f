#include "model/repeated_dims.h"

#include <catch2/catch.hpp>

using namespace ckpt;

namespace {

TensorChunk chunk(Shape offsets, Shape sizes, Shape strides) {
  TensorChunk c;
  c.offsets = std::move(offsets);
  c.sizes = std::move(sizes);
  c.strides = std::move(strides);
  return c;
}

}  // namespace

TEST_CASE("repeated dims: stride 0 over the whole dimension in every chunk", "[model]") {
  TensorEntry t;
  t.shape = {4, 1, 3, 5};
  t.chunks = {chunk({0, 0, 0, 0}, {4, 1, 3, 5}, {0, 0, 5, 0})};
  // dim 1 has size 1 (nothing repeats); dims 0 and 3 repeat; dim 2 does not.
  CHECK(repeated_dims(t) == std::vector<std::size_t>{0, 3});
  TensorEntry r = without_dims(t, {0, 3});
  CHECK(r.shape == Shape{1, 3});
  CHECK(r.chunks[0].strides == Shape{0, 5});
  CHECK(r.chunks[0].sizes == Shape{1, 3});
  CHECK(repeat_count(t.shape, {0, 3}) == 20);
  // Two chunks split on dim 0: dim 0 is not spanned whole by either.
  t.chunks = {chunk({0, 0, 0, 0}, {2, 1, 3, 5}, {0, 0, 5, 0}), chunk({2, 0, 0, 0}, {2, 1, 3, 5}, {0, 0, 5, 0})};
  CHECK(repeated_dims(t) == std::vector<std::size_t>{3});
}

TEST_CASE("full_index places a reduced element at the first logical element it stands for", "[model]") {
  // shape (2, 3, 4) without dim 1: reduced shape (2, 4); reduced index 5 is
  // (1, 1) -> full (1, 0, 1) = 1*12 + 0*4 + 1 = 13.
  CHECK(full_index({2, 3, 4}, {1}, 5) == 13);
  CHECK(full_index({2, 3, 4}, {0, 2}, 2) == 8);  // (2) -> (0, 2, 0)
  CHECK(full_index({7}, {0}, 0) == 0);
}
