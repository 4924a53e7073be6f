// Detects what kind of checkpoint SRC is (by listing and magic bytes) and
// reads it into a CheckpointModel with the matching reader.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "formats/dcp/dcp_reader.h"
#include "formats/input_format.h"
#include "formats/probe.h"  // directory_kind, for detect's callers
#include "model/checkpoint_model.h"

namespace ckpt {

// InvalidArgument/NotFound/DataLoss with a message naming SRC when it is none
// of the known kinds.
SourceKind detect_source(const std::string& src);
// detect_source(src), or kFsdpRanks for --files; usage error when neither is given.
SourceKind source_kind_of(const std::string& src, const ReadOptions& options);
// Reads SRC (or options.files) with the reader of its kind and fills the
// model's SourceInfo (kind, files, world sizes; readers add families and
// meshes), then passes the decoded tree through the gate of
// model/plain_values.h.
CheckpointModel read_checkpoint(const std::string& src, const ReadOptions& options = {});

}  // namespace ckpt
