// One output written by many processes (--part I/N): each worker runs the
// same writer over the whole output and materialises only the bytes of the
// tensors it owns (io/part_sink.h) into one shared file, with positional
// writes at offsets a layout pass fixed from the metadata alone, so nothing
// depends on which worker runs when. Each worker leaves a receipt (its part,
// the plan's hash, each tensor's output range and CRC-32); the worker that
// completes the set (elected with an exclusive create) or `--part finalize`
// writes everything else (the .pt's zip headers, descriptors and central
// directory with the receipts' CRCs; the safetensors header), and renames
// the file into place. The result is byte for byte the single-process
// output. Formats: .pt and .safetensors (sharded too: each shard is one
// shared file, the index written by finalize); docs/scaling.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "exec/write_output.h"

namespace ckpt {

struct PartSpec {
  int index = 0;  // this worker, 0-based
  int count = 1;  // workers in all
  bool finalize_only = false;
  std::string from;  // where index/count came from, for the log: "--part", "Slurm (SLURM_PROCID/SLURM_NTASKS)", ...
};

// "I/N" (0 <= I < N), "auto" (the launcher's environment: Slurm, Open MPI,
// PMI, torchrun; InvalidArgument naming the variables when none is set),
// or "finalize". InvalidArgument otherwise.
PartSpec parse_part(const std::string& text);

struct PartOutcome {
  bool published = false;   // this process finalized: OUT is in place
  std::string summary;      // what was done, for the success line
  std::size_t tensors = 0;  // this worker wrote
  uint64_t bytes = 0;
};

// This worker's share of the output at options.path, and the finalization
// when it completes the set. Exit 3 (DataLoss) when finalizing finds a
// receipt missing, stale or not matching the plan, naming the parts to rerun.
PartOutcome write_output_part(const CheckpointModel& model, OutputFormat format, const OutputOptions& options,
                              const PartSpec& part);

}  // namespace ckpt
