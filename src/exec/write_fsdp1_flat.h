// Writes the FSDP1 flat-parameter files of a plan (formats/fsdp_flat/
// flat_writer.h) to `dir`: one torch.save file per rank and family, each
// tensor streamed from the source's chunks (and zero padding), the folder
// published whole or not at all (io/atomic_dir).
#pragma once

#include <string>

#include "exec/tensor_copy.h"
#include "formats/fsdp_flat/flat_writer.h"

namespace ckpt {

struct Fsdp1FlatOutputOptions {
  std::string dir;
  bool force = false;
  bool durable = true;  // fsync every file before the folder is published (--no-fsync: false)
  CopyOptions copy;
};

void write_fsdp1_flat(const fsdp_flat::FlatPlan& plan, const Fsdp1FlatOutputOptions& options);

}  // namespace ckpt
