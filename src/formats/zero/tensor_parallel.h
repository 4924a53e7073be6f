// Tensor-parallel DeepSpeed checkpoints (an `mpu`, as Megatron-DeepSpeed
// passes one): each model-parallel rank's files hold its slices of the split
// tensors under the same names as every other rank's, and only the model
// knows along which dimension each was split. Megatron-DeepSpeed records that
// in the model-states files as `universal_checkpoint_info` (pattern lists by
// category), which DeepSpeed's ds_to_universal.py (merge_tp_slices) merges
// by. The slices are merged here exactly as it does (docs/deepspeed.md,
// "Tensor parallelism"); a checkpoint without such info is never merged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/linear_regex.h"
#include "model/checkpoint_model.h"
#include "pickle/value.h"

namespace ckpt::zero {

// How one tensor's slices merge: the category its name falls in.
struct TensorParallelRule {
  TensorParallelMerge merge;
  bool averaged = false;  // parameter_to_average_patterns: DeepSpeed writes the slices' mean
};

// The merge rules of universal_checkpoint_info. Patterns match as Python's
// re.match does (at the start of the name); a name matching none is
// concatenated on dim 0, as DeepSpeed's converter does.
class TensorParallelRules {
 public:
  // From `info` (the model-states file `path`'s universal_checkpoint_info).
  // Unimplemented (exit 3) for what ckptconv does not merge: sub-parameters
  // of uneven or declared shapes (parameter_with_sub_params) and affine maps.
  TensorParallelRules(const pickle::Value& info, const std::string& path);

  // DataLoss when two patterns of one category match `name` (DeepSpeed
  // asserts the same).
  TensorParallelRule rule_for(const std::string& name) const;

 private:
  struct Category {
    std::vector<std::pair<std::string, LinearRegex>> patterns;
    std::optional<std::string> match(const std::string& name, const std::string& path) const;
  };
  Category replicated_, averaged_, row_parallel_, vocabulary_, two_sub_params_;
  std::optional<int64_t> original_vocab_size_;
  std::string path_;
  friend TensorEntry merge_slices(const std::vector<const TensorEntry*>&, const TensorParallelRule&,
                                  const TensorParallelRules&, const std::string&);
};

// The tensor-parallel ranks' values of one tensor (slices[t]: rank t's) as
// one tensor named `name`, merged by `rule`: chunks placed where the merge
// puts them, no byte copied. Replicated and averaged slices are read and
// compared; different replicas are exit 3 (DataLoss; averaged ones
// Unimplemented: ckptconv copies bytes and does not compute DeepSpeed's mean).
TensorEntry merge_slices(const std::vector<const TensorEntry*>& slices, const TensorParallelRule& rule,
                         const TensorParallelRules& rules, const std::string& name);

}  // namespace ckpt::zero
