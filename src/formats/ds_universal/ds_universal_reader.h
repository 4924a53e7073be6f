// Reader of DeepSpeed universal checkpoints (UCP: what ds_to_universal.py
// and `ckptconv reshard --layout deepspeed-universal` write; docs/deepspeed.md)
// into the CheckpointModel the ZeRO reader gives for the checkpoint it came
// from: {"model": {fqn: tensor}, "optim": {"state": {fqn: {step, exp_avg,
// ...}}, "param_groups": [{..., "params": [fqn, ...]}]}, lr_scheduler,
// global_steps, global_samples, skipped_steps, client_state}.
//
// Trainable parameters are zero/<fqn>/fp32.pt (ZeRO-3's flat 1-D tensors
// shaped by param_shapes); their states the folder's other files, the step
// from step.pt or, where ds_to_universal's ZeRO-3 path writes none, from
// optimizer_state.pt. Frozen parameters and buffers are the model-states
// file's `module` values as saved (ZeRO-3: frozen_param_fragments of the
// per-rank files), else their zero/<fqn>/fp32.pt; tied aliases
// (shared_params) reference their owner. Nothing is loaded: each tensor's
// chunk points into its file.
#pragma once

#include <string>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::ds_universal {

// A tag folder (zero/optimizer_state.pt beside a *model_states.pt), or a
// root that reads one without --tag: its `latest` names one, or it has no
// `latest` and its latest_universal names one (formats/checkpoint_root.h
// chooses the tag a root reads).
bool is_universal_checkpoint(const std::string& dir);

// A universal checkpoint's tag folder itself, not a root.
bool is_universal_tag(const std::string& dir);

// `only`: --only, for dropping client-state entries that name unknown globals.
CheckpointModel read_universal(const std::string& src, ProblemSink* problems = nullptr, const std::string& only = "");

}  // namespace ckpt::ds_universal
