// What the layers above formats/ may ask of a source's format, so that jobs
// and checks decide by a trait and never by naming a format: a new format
// states its answers in its descriptor (formats/input_format.h), next to its
// reader, instead of in every job that treats it specially.
#pragma once

#include <string_view>

#include "model/source_info.h"

namespace ckpt {

struct SourceTraits {
  // Stored sharded (DCP items, per-rank files, ZeRO partitions): reshard
  // writes its own layout without --layout; a full state dict needs one.
  bool sharded_layout = false;
  // reshard's default --layout; empty: by the tensors (DTensor values give
  // fsdp-dtensor, others fsdp-sharded-tensor).
  std::string_view reshard_layout = {};
  // The reader applies --only itself (model and optimizer are separate
  // files), so selection must not apply it again.
  bool reader_selects_only = false;
  // Per-rank files with their own names and per-tensor sharding: reshard to
  // rank files keeps their names, sharding and DeviceMesh.
  bool per_rank_files = false;
};

// The traits of `kind`'s registered format (defined in formats/registry.cc).
const SourceTraits& source_traits(SourceKind kind);

}  // namespace ckpt
