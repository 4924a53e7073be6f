// Structural checks of a CheckpointModel that need no tensor bytes: every
// chunk lies inside its tensor and inside its storage, chunks do not
// overlap, and together they cover the tensor exactly.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt {

// Every problem of one tensor, each message naming tensor, chunk, file and rank.
std::vector<std::string> tensor_problems(const TensorEntry& tensor);
// The same problems one by one, each with the chunk at fault (nullptr for a
// gap, which no one chunk causes), for callers that keep file and rank apart.
using TensorProblemVisitor = std::function<void(const std::string& message, const TensorChunk* chunk)>;
void visit_tensor_problems(const TensorEntry& tensor, const TensorProblemVisitor& report);
// Every problem of the model.
std::vector<std::string> model_problems(const CheckpointModel& model);
// DataLoss listing the first problems, if any. Called before writing anything.
void require_valid(const CheckpointModel& model);

}  // namespace ckpt
