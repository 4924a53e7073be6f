// The files of a DeepSpeed universal checkpoint (UCP), planned from a full
// training state dict ({"model": {fqn: tensor}, "optim": {"state": {fqn:
// {...}}, "param_groups": [{..., "params": [fqn, ...]}]}, as every reader
// gives it), in the shapes DeepSpeed 0.19.8's ds_to_universal.py writes and
// an engine with "checkpoint": {"load_universal": true} loads at any world
// size (docs/deepspeed.md, "Universal checkpoints"):
//
//   zero/<fqn>/fp32.pt          {'cat_dim': 0, 'param': full fp32 tensor}
//                               (a tensor-parallel source merged by its
//                               patterns: its category's keys, as
//                               merge_tp_slices writes them)
//   zero/<fqn>/<key>.pt         the same for each optimizer state of the
//                               parameter's shape (exp_avg, exp_avg_sq)
//   zero/<fqn>/step.pt          the step, a 0-d float32 tensor
//   zero/<fqn>/fp32.pt          parameters without optimizer state and
//                               buffers: {'param': fp32 tensor} (never loaded)
//   zero/optimizer_state.pt     ds_version, param_groups (hyper-parameters,
//                               'params': [group index]) and
//                               optimizer_state_dict {'state': {g: {'step'}},
//                               'param_groups'}: ZeRO-3 reads these
//   mp_rank_00_model_states.pt  what the engine reads besides the tensors:
//   zero_pp_rank_0_mp_rank_00_model_states.pt  dp_world_size, mp_world_size,
//                               global_steps, skipped_steps, global_samples,
//                               lr_scheduler; param_shapes (per param group),
//                               frozen_param_shapes, buffer_names and
//                               shared_params as DeepSpeed names them; and
//                               the client state at top level
//
// Pure: no I/O; exec/write_ds_universal.h writes the plan.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "formats/torch_pt/pt_writer.h"
#include "model/checkpoint_model.h"

namespace ckpt::ds_universal {

// Where an output tensor's bytes come from: a tensor of the model (cast to
// the output dtype) or bytes made here (a Python int step as float32).
struct TensorSource {
  std::size_t model_tensor = 0;
  bool literal = false;
  std::string bytes;  // literal: the little-endian bytes
  // Nonempty: these tensors of the model (of one shape and dtype) stacked
  // along a new first dimension, one per expert-parallel rank (MoE experts,
  // see plan_universal); model_tensor is the first.
  std::vector<std::size_t> stacked;
};

// One torch.save file of the tree. Its archive folder is the file's stem
// (torch.save(obj, "fp32.pt") writes fp32/data.pkl).
struct UniversalFile {
  std::string path;       // relative to the tag folder: "zero/l1.weight/fp32.pt"
  pickle::ValuePtr root;  // tensor references index `tensors`
  std::vector<torch_pt::OutputTensor> tensors;
  std::vector<TensorSource> sources;  // one per tensor

  uint64_t tensor_bytes() const {
    uint64_t n = 0;
    for (const auto& t : tensors) n += shape_numel(t.shape) * dtype_size(t.dtype);
    return n;
  }
};

struct UniversalPlan {
  std::vector<UniversalFile> files;
  std::size_t params = 0;  // parameters with optimizer state
  std::size_t others = 0;  // parameters without, tied aliases and buffers
  uint64_t tensor_bytes = 0;
};

// MoE (deepspeed.moe) at expert-parallel size ep > 1 (the source records
// it): DeepSpeed 0.19.8's universal load looks each parameter up by the name
// the loading rank's module gives it, and an expert is named there by its
// local index (deepspeed_experts.0 .. L-1 on every expert-parallel rank, L =
// num_experts / ep). So expert i's files hold, stacked along a new first
// dimension, the values of global experts i, L + i, ..., (ep - 1)L + i, with
// 'is_expert_param': True and 'ep_num_experts': ep, which the loader
// (universal_checkpoint.py load_hp_checkpoint_state) slices by its own
// expert-parallel rank: such a checkpoint loads at any data-parallel size
// with the same ep (at another ep the loader's own checks refuse it). No
// folder is written under a global name >= L.
//
// The plan for `model`, read from a source written at `source_world_size`
// ranks (the model states' dp_world_size), for engines at expert-parallel
// size `expert_parallel` (absent: the one the source records). InvalidArgument
// naming the entry when the state dict is not a full training state dict
// keyed by FQN (an optimizer state keyed by index, --only, a name that is not
// a plain path component), or a parameter's state does not have its shape;
// Unimplemented when the model names DeepSpeed experts, records no
// expert-parallel size and none is given (the folders' names depend on it),
// or its experts do not divide over the size, and for tensor-parallel ranks
// read unmerged (no universal_checkpoint_info).
UniversalPlan plan_universal(const CheckpointModel& model, int source_world_size,
                             std::optional<int> expert_parallel = std::nullopt);

}  // namespace ckpt::ds_universal
