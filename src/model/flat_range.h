// Element ranges of flat 1-D partitions as chunks of the tensors they hold:
// DeepSpeed ZeRO and universal checkpoints, FSDP1 flat parameters and
// Megatron's distrib_optim.pt each store a parameter as a range of elements
// of a flat buffer; their writers lay parameters into such buffers.
#pragma once

#include <cstdint>
#include <string>

#include "model/checkpoint_model.h"

namespace ckpt {

// Adds to `out` (its shape set) the chunks holding its flattened elements
// [begin, begin+n), read from `src` (a flat 1-D partition: one contiguous
// chunk) from its element `src_elem`; `rank` is recorded in each chunk.
// DataLoss naming `what` when `src` is no such partition or too short.
void add_flat_range(TensorEntry& out, const TensorEntry& src, uint64_t src_elem, uint64_t begin, uint64_t n, int rank,
                    const std::string& what);

// The other way: appends to the 1-D `out`, at its element `at`, the chunks
// of `t` in row-major order (a parameter laid into a flat buffer).
void append_flat(TensorEntry& out, const TensorEntry& t, uint64_t at);

// Appends to the 1-D `out` zeros at its elements [at, at + n) (a flat
// buffer's padding), from memory.
void append_zeros(TensorEntry& out, uint64_t at, uint64_t n);

}  // namespace ckpt
