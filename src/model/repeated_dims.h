// Dimensions of a tensor that repeat one slice of values: every chunk spans
// the dimension whole with stride 0 (torch's expand; a 4-byte storage viewed
// as 2^40 elements is a 1 KB file). A pass that only counts over values
// (the finite scan, diff's statistics) reads the tensor without them and
// scales its counts, rather than walking every logical element. A checksum
// of the logical bytes still needs them all.
#pragma once

#include <cstdint>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt {

// The dimensions (ascending) of size > 1 that every chunk of `t` views whole
// with stride 0; empty when there are none.
std::vector<std::size_t> repeated_dims(const TensorEntry& t);

// `t` with `dims` (ascending, from repeated_dims) removed from its shape and
// from every chunk's offsets, sizes and strides: the same storage bytes.
TensorEntry without_dims(const TensorEntry& t, const std::vector<std::size_t>& dims);

// How many logical elements each element of without_dims(t, dims) stands for.
uint64_t repeat_count(const Shape& shape, const std::vector<std::size_t>& dims);

// The row-major index in `shape` of the element at row-major index `reduced`
// of `shape` without `dims`, those dimensions' indices being 0: the first
// logical element the reduced one stands for.
uint64_t full_index(const Shape& shape, const std::vector<std::size_t>& dims, uint64_t reduced);

}  // namespace ckpt
