// Reader of DeepSpeed ZeRO checkpoints (stages 1, 2, 3 and the
// BF16_Optimizer; docs/deepspeed.md) into a CheckpointModel shaped like
// torch's FULL_STATE_DICT: {"model": {fqn: tensor}, "optim": {"state": {fqn:
// {step, exp_avg, ...}}, "param_groups": [{..., "params": [fqn, ...]}]}}.
// Trainable weights are the fp32 master copies, gathered from every rank's
// flat partitions by element ranges: each output tensor's chunks point into
// the ranks' partition records, so nothing is loaded here and a job streams
// them like any other sharded source. Frozen parameters and buffers are as
// saved (their low-precision dtype), tied aliases reference their owner.
#pragma once

#include <optional>
#include <string>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::zero {

// True for a checkpoint root (a `latest` file naming a tag directory) or a
// tag directory holding DeepSpeed's *_model_states.pt files.
bool is_zero_checkpoint(const std::string& dir);

// True for a DeepSpeed root: a folder whose tag directories hold the
// *_model_states.pt files (inspect lists its tags), not a tag itself.
bool is_deepspeed_root(const std::string& dir);

// True for a directory holding DeepSpeed's *_optim_states.pt or
// *_model_states.pt files: a tag, finished or not.
bool holds_zero_files(const std::string& dir);

// A tag directory's world size from its file names: the optimizer files
// are ranks 0..N-1, each once, beside the model-states file (ZeRO-3: one
// per rank); nullopt when a rank's file or the model states are missing,
// as in a save that died. A save whose last ranks' files are all missing looks
// complete at a smaller N: validate --expect-world-size tells.
std::optional<int> tag_world_size(const std::string& dir);

// `tag`: the tag directory to read under a root; empty: the one `latest` names.
// Always {"model", "optim", ...}: --only is applied by plan/select as for
// every source (the fp32 masters come from the optimizer files either way);
// `only` set only lets client_state entries naming unknown globals be
// dropped instead of refused.
CheckpointModel read_zero(const std::string& src, const std::string& tag = "", const std::string& only = "",
                          ProblemSink* problems = nullptr);

}  // namespace ckpt::zero
