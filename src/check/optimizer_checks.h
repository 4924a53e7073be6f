// Consistency of optimizer state dicts inside a checkpoint: every entry of
// `state` belongs to a parameter listed in `param_groups`, no parameter is in
// two groups, and, when the checkpoint also holds the model (a "model" entry
// beside the optimizer), every listed parameter is a model tensor whose shape
// the per-element state tensors (exp_avg, exp_avg_sq, momentum_buffer, ...)
// share. Needs no tensor bytes.
#pragma once

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::check {

// An optimizer state dict is a dict with a "state" dict and a
// "param_groups" list of dicts holding "params"; found at the root or under
// a top-level key ("optim", "optimizer", ...), or the flattened form
// torchtitan saves (keys "state.<fqn>.<name>", "param_groups.<fqn>.<key>"). Reports into `sink`; returns
// how many optimizer state dicts were checked. `complete`: the model was read
// without problems; when false, a group without its "params" (an item that
// could not be read) is not reported again and its optimizer is not matched.
int check_optimizer_state(const CheckpointModel& model, bool complete, ProblemSink& sink);

}  // namespace ckpt::check
