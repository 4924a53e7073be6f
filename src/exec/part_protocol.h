// The --part protocol: one output written by many processes (--part I/N): each worker runs the
// same writer over the whole output and materialises only the bytes of the
// stored tensors it owns (io/part_sink.h) into shared files, with positional
// writes at offsets a layout pass fixed from the metadata alone, so nothing
// depends on which worker runs when. Work is shared by bytes; a tensor that
// spans a share's boundary is cut there at a dim-0 row, so one big tensor is
// written by several workers. Each worker leaves a receipt (its part, the
// plan's hash, each piece's output range and CRC-32); the worker that
// completes the set (elected with an exclusive create), `--part finalize`
// or `ckptconv finalize OUT` writes everything else (a .pt's zip headers,
// descriptors and central directory with the pieces' CRCs joined; the
// safetensors header and index; a DCP directory's .metadata) and publishes
// the output. The result is byte for byte the single-process output (a DCP
// .metadata's random save id aside). Formats: .pt, .safetensors (sharded
// too), DCP directories, per-rank files and DeepSpeed universal checkpoints
// (reshard); docs/scaling.md. An s3:// OUT is shared through multipart
// uploads instead of files (exec/object_store_parts.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "exec/part_layout.h"
#include "exec/parted_writer.h"

namespace ckpt {

// "I/N" (0 <= I < N), "auto" (the launcher's environment: Slurm, Open MPI,
// PMI, torchrun; InvalidArgument naming the variables when none is set),
// "finalize" or "abort". InvalidArgument otherwise.
PartSpec parse_part(const std::string& text);

// This worker's share of the output, and the finalization when it
// completes the set. Exit 3 (DataLoss) when finalizing finds a receipt
// missing, stale or not matching the plan, naming the parts to rerun.
PartOutcome write_parted(PartedWriter& writer, const PartedOptions& options, const PartSpec& part);

// The parts folders of OUT (OUT.parts-*), for `ckptconv finalize OUT`.
std::vector<std::string> parts_folders(const std::string& output);
// The request a folder's workers stored; nullopt when it holds none.
std::optional<std::string> stored_request(const std::string& folder);

}  // namespace ckpt
