// Writes a CheckpointModel as one output file, atomically: the destination
// appears complete or not at all.
#pragma once

#include <string>

#include "exec/tensor_copy.h"
#include "model/checkpoint_model.h"

namespace ckpt {

struct OutputOptions {
  std::string path;
  bool force = false;  // overwrite an existing output
  CopyOptions copy;
};

// A torch.save archive of the model's structure with every tensor
// consolidated (contiguous). Validates the model first.
void write_pt_output(const CheckpointModel& model, const OutputOptions& options);

}  // namespace ckpt
