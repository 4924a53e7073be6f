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
#include "formats/zero/zero_listing.h"
#include "model/checkpoint_model.h"

namespace ckpt::zero {

// is_zero_checkpoint, is_deepspeed_root, holds_zero_files and
// tag_world_size (what a folder's file names say) are in zero_listing.h.

// `tag`: the tag directory to read under a root; empty: the one `latest` names.
// Always {"model", "optim", ...}: --only is applied by plan/select as for
// every source (the fp32 masters come from the optimizer files either way);
// `only` set only lets client_state entries naming unknown globals be
// dropped instead of refused.
CheckpointModel read_zero(const std::string& src, const std::string& tag = "", const std::string& only = "",
                          ProblemSink* problems = nullptr);

}  // namespace ckpt::zero
