// Pure transformations of a CheckpointModel before it is written: keep a
// subset of its entries (--only, --keys) and choose output dtypes (--dtype).
#pragma once

#include <optional>
#include <string>

#include "model/checkpoint_model.h"

namespace ckpt {

struct SelectOptions {
  std::string only;              // "", "model" or "optim": the top-level entry that becomes the root
  std::string keys;              // ECMAScript regex searched in each leaf's dotted path; "" keeps all
  std::optional<DType> cast_to;  // floating-point tensors become this dtype
  // --only keeps the entry under its top-level key ({"model": {...}}), as a
  // resharded DCP checkpoint must for the job that loads it.
  bool keep_nesting = false;
  // Leave out tensors marked TensorEntry::frozen (parameters the job did not train).
  bool exclude_frozen = false;
};

// A model holding only the selected leaves. --only NAME makes the top-level
// entry NAME the root (for optim also "optimizer"), so keys are named as
// model.state_dict() / optimizer.state_dict() name them; --keys then
// matches paths below it. Dicts keep the selected entries
// (dicts left empty are dropped); a list is kept whole when any leaf under it
// is selected, so indices never shift. Tensors are renumbered; unselected
// ones are gone. InvalidArgument when nothing is selected or the regex is bad.
CheckpointModel select_entries(const CheckpointModel& model, const SelectOptions& options);

// Sets TensorEntry::out_dtype for floating-point tensors, except optimizer
// `step` counters, which keep their dtype as torch optimizers expect.
void apply_cast(CheckpointModel& model, DType to);

// "keep" -> nullopt; "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16".
std::optional<DType> parse_dtype_option(const std::string& text);

}  // namespace ckpt
