// One output written by many processes (--part I/N): each worker runs the
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
// (reshard); docs/scaling.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
  std::size_t tensors = 0;  // pieces this worker wrote
  uint64_t bytes = 0;
};

// One stored tensor of a parted output, or raw bytes that are no tensor of
// the model (a DeviceMesh's rank map), in the order the writer emits them.
struct PartUnit {
  std::size_t file = 0;  // which of the writer's files
  uint64_t nbytes = 0;
  const TensorEntry* tensor = nullptr;  // its bytes are append_tensor(*tensor)
  std::string_view bytes;               // else these
};
// Puts the unit's bytes, or a gap of its size that another process fills,
// at the sink's position; `zip` is the archive's writer when the unit is a
// record of one (.pt, DCP items, rank files), else null (safetensors).
using EmitUnit = std::function<void(const PartUnit& unit, ByteSink& sink, archive::ZipWriter* zip)>;

// What a writer put in place.
struct Published {
  std::vector<std::string> files;  // in order: OUT, a sharded output's shards then its index, or the directory
  std::string what;                // for the log: "one file", "3 shards and the index", "12 files"
};

// A format's writer, run over all of its files at once, emitting every
// stored tensor in a fixed order. One class serves both drivers: a run by
// one process (write_whole) and by many (write_parted), which give the
// same bytes because they run the same code.
class PartedWriter {
 public:
  virtual ~PartedWriter() = default;
  virtual std::string kind() const = 0;  // "pt", "dcp", ...: part of the plan's hash
  // The output's files, by name, in the order run() fills them.
  virtual std::vector<std::string> file_names() const = 0;
  // What must not exist before the run unless --force: the output files,
  // or the output directory.
  virtual std::vector<std::string> destinations() const = 0;
  // Where file k will be, for messages.
  virtual std::string output_path(std::size_t k) const = 0;
  // File k into *sinks[k]; every stored tensor through `emit`.
  virtual void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) = 0;
  // Whether run() fills its files one after another (never writing file j
  // once it has begun a later one), so that one process needs one file open
  // at a time. DCP fills its ranks' files together, item by item.
  virtual bool fills_files_in_order() const { return true; }
  // After the last run(): puts the complete files (at data_path(k)) in
  // place, all or nothing, never replacing what appeared meanwhile unless
  // `force`; says what it published.
  virtual Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) = 0;
};

struct PartedOptions {
  std::string path;  // OUT; the shared files and receipts go to OUT.parts-<plan hash>/
  bool force = false;
  bool durable = true;
  CopyOptions copy;
  std::vector<std::string> inputs;  // the source's files: receipts made before one changed are stale
  std::string request;              // the job's request (JSON), kept beside the parts for `ckptconv finalize OUT`
};

// The options of a directory output (reshard's DCP and per-rank layouts)
// read from `model`.
PartedOptions directory_output(const std::string& dir, bool force, bool durable, const CopyOptions& copy,
                               const CheckpointModel& model, const std::string& request);

// The one-process run: every file written whole into a scratch folder
// beside OUT ("OUT.tmp-XXXXXX/", removed whatever happens: an error or an
// interrupt leaves nothing), then published by the writer as the finalizing
// worker of a parted run publishes. `inputs` and `request` are not used.
Published write_whole(PartedWriter& writer, const PartedOptions& options);

// Each of the writer's files' exact size, from a run against counting
// sinks that skips every unit's bytes (no tensor data is read): --dry-run.
std::vector<uint64_t> output_sizes(PartedWriter& writer);

// This worker's share of the output, and the finalization when it
// completes the set. Exit 3 (DataLoss) when finalizing finds a receipt
// missing, stale or not matching the plan, naming the parts to rerun.
PartOutcome write_parted(PartedWriter& writer, const PartedOptions& options, const PartSpec& part);

// Renames finished files (at data_path(k)) onto `to`, all or none (the ones
// this call renamed are removed again when one fails); io/atomic_dir.h's
// rename_into_place for each.
void rename_all(const std::function<std::string(std::size_t)>& data_path, const std::vector<std::string>& to,
                bool force);

// .pt and .safetensors outputs of consolidate/convert; HDF5 is refused.
PartOutcome write_output_part(const CheckpointModel& model, OutputFormat format, const OutputOptions& options,
                              const PartSpec& part, const std::string& request);

// For directory outputs (reshard): moves the finished files into a new
// directory for `dir` (io/atomic_dir.h) under their names (a name with '/'
// gets its folders made), lets `extra` put
// what else belongs there (DCP's .metadata) into it, and renames it into
// place.
Published publish_directory(const std::string& dir, const std::vector<std::string>& names,
                            const std::function<std::string(std::size_t)>& data_path, bool force, bool durable,
                            const std::function<void(const std::string& temp_dir)>& extra);

// The parts folders of OUT (OUT.parts-*), for `ckptconv finalize OUT`.
std::vector<std::string> parts_folders(const std::string& output);
// The request a folder's workers stored; nullopt when it holds none.
std::optional<std::string> stored_request(const std::string& folder);

}  // namespace ckpt
