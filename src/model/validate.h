// Structural checks of a CheckpointModel that need no tensor bytes: every
// chunk lies inside its tensor and inside its storage, chunks do not
// overlap, and together they cover the tensor exactly.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt {

// Every problem of one tensor as a Problem (DataLoss; the message names the
// tensor and chunk, `file`/`rank` are the chunk's, `tensor` its name). `gap`
// is true for a coverage gap, which no one chunk causes (file "", rank -1).
// Empty when the tensor's shape is one torch can hold (no negative
// dimension, at most 2^63 - 1 elements, bytes read and written within 64
// bits); else why not. Checked first by visit_tensor_problems: numel() and
// nbytes() are only meaningful when it is empty.
std::string tensor_shape_problem(const TensorEntry& tensor);
using TensorProblemVisitor = std::function<void(Problem problem, bool gap)>;
void visit_tensor_problems(const TensorEntry& tensor, const TensorProblemVisitor& report);
// Every problem of every tensor, into `sink`: the one problem channel.
void check_model(const CheckpointModel& model, ProblemSink& sink);
// DataLoss naming the first problem (and how many more), if any. Called
// before writing anything.
void require_valid(const CheckpointModel& model);

}  // namespace ckpt
