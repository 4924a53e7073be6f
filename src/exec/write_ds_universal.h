// Writes a DeepSpeed universal checkpoint (formats/ds_universal/
// ds_universal_writer.h) to `dir`, the tag folder (<root>/<tag>_universal):
// one torch.save file per parameter and state, streamed from the source's
// chunks, the folder published whole or not at all (io/atomic_dir), then
// <root>/latest_universal naming it, as ds_to_universal.py does. No
// temporary copy of the checkpoint: each tensor is read once; --part splits
// the files' tensors across processes.
#pragma once

#include <string>

#include "exec/parted_output.h"
#include "exec/tensor_copy.h"
#include "formats/ds_universal/ds_universal_writer.h"
#include "model/checkpoint_model.h"

namespace ckpt {

struct UniversalOutputOptions {
  std::string dir;
  bool force = false;
  bool durable = true;  // fsync every file before the folder is published (--no-fsync: false)
  CopyOptions copy;
};

void write_ds_universal(const CheckpointModel& model, const ds_universal::UniversalPlan& plan,
                        const UniversalOutputOptions& options);

// --part: this worker's share of the same files; the worker completing the
// set publishes the folder and latest_universal (exec/parted_output.h).
PartOutcome write_ds_universal_part(const CheckpointModel& model, const ds_universal::UniversalPlan& plan,
                                    const UniversalOutputOptions& options, const PartSpec& part,
                                    const std::string& request);

}  // namespace ckpt
