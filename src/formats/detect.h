// Detects what kind of checkpoint SRC is (by listing and magic bytes) and
// reads it into a CheckpointModel with the matching reader.
#pragma once

#include <string>
#include <vector>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt {

// kFsdpRanks: a directory without `.metadata` holding per-rank files, a glob
// pattern, or files listed with --files.
enum class SourceKind { kTorchPt, kDcpDir, kFsdpRanks, kSafetensors, kSafetensorsIndex, kHdf5 };

struct ReadOptions {
  std::vector<std::string> files;  // --files: per-rank files given one by one (SRC is then empty)
  // --only: per-rank families hold model and optimizer in separate files, so
  // their reader reads only that kind and gives its state dict alone. Other
  // readers ignore it (select_entries applies it to their top-level keys).
  std::string only;
  // validate: readers verify the CRC-32 of every zip record and report each
  // problem they can read past here instead of failing on the first (see
  // core/problems.h); nullptr reads fail-fast, as consolidate needs.
  ProblemSink* problems = nullptr;
};

const char* source_kind_name(SourceKind kind);
// InvalidArgument/NotFound/DataLoss with a message naming SRC when it is none
// of the known kinds.
SourceKind detect_source(const std::string& src);
CheckpointModel read_checkpoint(const std::string& src, const ReadOptions& options = {});

}  // namespace ckpt
