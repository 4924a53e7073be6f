// Detects what kind of checkpoint SRC is (by listing and magic bytes) and
// reads it into a CheckpointModel with the matching reader.
#pragma once

#include <string>

#include "model/checkpoint_model.h"

namespace ckpt {

enum class SourceKind { kTorchPt, kDcpDir };

const char* source_kind_name(SourceKind kind);
// InvalidArgument/NotFound/DataLoss with a message naming SRC when it is none
// of the known kinds.
SourceKind detect_source(const std::string& src);
CheckpointModel read_checkpoint(const std::string& src);

}  // namespace ckpt
