// Writes the FSDP1 flat-parameter files of a plan (formats/fsdp_flat/
// flat_writer.h) to `dir`: one torch.save file per rank and family, each
// tensor streamed from the source's chunks (and zero padding), the folder
// published whole or not at all (io/atomic_dir).
#pragma once

#include "exec/write_rank_files.h"
#include "formats/fsdp_flat/flat_writer.h"

namespace ckpt {

// Per-rank files, written with write_rank_files' options.
void write_fsdp1_flat(const fsdp_flat::FlatPlan& plan, const RankFilesOptions& options);

// --part: this worker's share of the files (exec/parted_output.h); the
// finalizing worker publishes the folder. `model` is the plan's source.
PartOutcome write_fsdp1_flat_part(const CheckpointModel& model, const fsdp_flat::FlatPlan& plan,
                                  const RankFilesOptions& options, const PartSpec& part, const std::string& request);

}  // namespace ckpt
