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

// Which tensors are an optimizer's state: every tensor when the root is an
// optimizer's own state dict (state + param_groups); else those under a
// top-level entry --only optim names (optim, optimizer, optimizer_<n>) or
// a flat top-level key under one ("optimizer.state.exp_avg.w": Megatron's
// stored view).
std::vector<bool> optimizer_state_tensors(const CheckpointModel& model);

// --dtype and --optim-dtype: sets TensorEntry::out_dtype of the model's
// floating-point tensors to `model_to` and of the optimizer's state to
// `optim_to` (nullopt: kept). A resumed job must read the state it saved,
// so the optimizer's is cast only when asked; `step` counters never are,
// as torch optimizers expect. Returns what was cast and kept, for the note
// the job prints.
struct CastCounts {
  std::size_t model_cast = 0;
  std::size_t optim_cast = 0;
  std::size_t optim_kept = 0;  // floating-point optimizer state left as it is
  // float4_e2m1fn_x2 tensors, never cast: packed quantized weights whose
  // values mean something only with their scales (as integer tensors, kept).
  std::size_t packed_kept = 0;
};
CastCounts apply_cast(CheckpointModel& model, std::optional<DType> model_to, std::optional<DType> optim_to);

// "keep" -> nullopt; "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16".
std::optional<DType> parse_dtype_option(const std::string& text);

}  // namespace ckpt
