// Human and JSON descriptions of a CheckpointModel (inspect). The JSON schema
// is documented in docs/inspect-json.md and versioned by "schema".
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

#include "model/checkpoint_model.h"

namespace ckpt {

void describe_model(const CheckpointModel& model, std::ostream& out);

// True when the checkpoint is a model's state dict alone: a dict (or
// OrderedDict) with none of the top-level entries a training checkpoint adds
// ("model", "optim", "optimizer", "state", "param_groups", "lr_scheduler",
// "client_state", "global_steps"). inspect counts its tensors as parameters;
// `-o DIR/` names it model.* rather than full.*.
bool holds_weights_only(const CheckpointModel& model);
nlohmann::ordered_json model_to_json(const CheckpointModel& model);
// --dry-run of consolidate/convert, for writing `output`: a summary that
// fits a screen (counts, sources, the largest tensors, the totals), or with
// `detailed` (-v) every output tensor with its dtype change and the source
// chunks it is read from.
void describe_plan(const CheckpointModel& model, const std::string& output, bool detailed, std::ostream& out);

}  // namespace ckpt
