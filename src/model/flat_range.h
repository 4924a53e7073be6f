// Element ranges of flat 1-D partitions as chunks of the tensors they hold:
// DeepSpeed ZeRO and universal checkpoints, and FSDP1 flat parameters, each
// store a parameter as a range of elements of a flat buffer.
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

}  // namespace ckpt
