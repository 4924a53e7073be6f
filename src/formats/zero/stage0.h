// Reader of DeepSpeed checkpoints written without ZeRO
// (`zero_optimization.stage: 0`, docs/deepspeed.md "Without ZeRO"): no
// *_optim_states.pt files; data-parallel rank 0's mp_rank_00_model_states.pt
// holds the engine optimizer's own state_dict() under `optimizer`: a torch
// optimizer's (fp32) or FP16_UnfusedOptimizer's (fp16: loss scaler,
// `optimizer_state_dict`, and the fp32 masters as `fp32_groups`).
//
// Nothing in the files names the optimizer's positions (param_shapes is None
// at stage 0); DeepSpeed resumes them by position. Each position is mapped to
// a module parameter only where the files determine it: its shape, and for
// fp16 its master cast to fp16 equal to the module's value, leave exactly one
// parameter; or, in one param group, exactly one order-preserving way to place
// the positions on the module's parameters. Anything else is exit 3.
#pragma once

#include <optional>
#include <string>

#include "core/problems.h"
#include "formats/zero/zero_listing.h"
#include "model/checkpoint_model.h"

namespace ckpt::zero {

// The stage-0 checkpoint `listing` holds (mp_rank_00_model_states.pt, or a
// pipeline's mp_rank_SS_model_states.pt and layer files; no optimizer files),
// as torch's full state dict. A pipeline's stages' positions, concatenated in
// stage order, are placed on its layers' parameters in layer order. A
// model-states file with no `optimizer` (a ZeRO checkpoint whose optimizer
// files are missing) is NotFound.
CheckpointModel read_stage0(const TagListing& listing, ProblemSink* problems, const std::string& only);

// The world size (dp_world_size x stages) of a tag directory saved without
// ZeRO and complete: the names of a stage-0 tag (every stage's
// mp_rank_SS_model_states.pt 00..S-1, no *_optim_states.pt, no per-rank
// model states) and mp_rank_00's `optimizer` entry holding the optimizer
// state. nullopt otherwise: the same names with `optimizer` None are a ZeRO
// save that died before its optimizer files. Costs the pickle of that one
// file (no tensor is read); a file that does not decode is nullopt too (the
// reader says why when the tag is read).
std::optional<int> stage0_world_size(const std::string& dir);

}  // namespace ckpt::zero
