// Writes a DeepSpeed universal checkpoint (formats/ds_universal/
// ds_universal_writer.h) to `dir`, the tag folder (<root>/<tag>_universal):
// one torch.save file per parameter and state, streamed from the source's
// chunks, the folder published whole or not at all (io/atomic_dir), then
// <root>/latest_universal naming it, as ds_to_universal.py does. No
// temporary copy of the checkpoint: each tensor is read once.
#pragma once

#include <string>

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

}  // namespace ckpt
