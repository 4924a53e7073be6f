// Detects what kind of checkpoint SRC is (by listing and magic bytes) and
// reads it into a CheckpointModel with the matching reader.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt {

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
  // --tag: a DeepSpeed checkpoint's tag directory under SRC (default: the
  // one `latest` names), or the checkpoint to read in a folder of them
  // (formats/checkpoint_root.h).
  std::string tag = {};
  // inspect: one rank's file of a per-rank family or DeepSpeed tag may be
  // read alone, as the file it is (with a warning); other commands refuse
  // it (exit 2), as its content alone would make a wrong whole.
  bool one_rank_alone = false;
};

// The model directory inside a kDcpPair folder (Accelerate names its i-th
// model pytorch_model_fsdp_<i> and optimizer optimizer_<i>).
inline constexpr const char* dcp_pair_model_dir = "pytorch_model_fsdp_0";

// The kind of checkpoint the directory `dir` is, or nullopt when it is none
// (it may still be a folder of checkpoints: formats/checkpoint_root.h).
std::optional<SourceKind> directory_kind(const std::string& dir);

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
