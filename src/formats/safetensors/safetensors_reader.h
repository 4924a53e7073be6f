// Reader of safetensors files into a CheckpointModel: the header validated
// (safetensors_format.h), each tensor one contiguous chunk pointing into the
// file. A file written by ckptconv gets its state dict back from the
// "ckptconv.tree" metadata; any other file is a flat dict name -> tensor, in
// header order. Tensor bytes are never read here.
#pragma once

#include <string>

#include "model/checkpoint_model.h"

namespace ckpt::safetensors {

// A whole .safetensors file as a model (format "safetensors").
CheckpointModel read_safetensors_file(const std::string& path);

}  // namespace ckpt::safetensors
