// Comparing tensors by their bytes, read through their chunks' sources:
// what a per-rank family's replicated plain tensors (formats/fsdp_ranks) and
// FSDP1's tied or unsharded parameters (formats/fsdp_flat) are checked by.
#pragma once

#include "model/checkpoint_model.h"

namespace ckpt {

// True when two plain (single-chunk) tensors hold the same elements bytewise.
bool same_tensor_bytes(const TensorEntry& a, const TensorEntry& b);

// True when two tensors of any chunking (a ZeRO parameter's pieces of
// several ranks' partitions) have the same dtype, shape and elements
// bytewise. Each is read whole into memory: for the small tensors a
// checkpoint keeps replicated (norms, biases), not for bulk comparison.
bool same_tensor_values(const TensorEntry& a, const TensorEntry& b);

}  // namespace ckpt
