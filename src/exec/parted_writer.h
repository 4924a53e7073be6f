// The writer interface both output drivers run (exec/parted_output.h: one
// process; exec/part_protocol.h: --part, many): a format's or a reshard
// layout's files, every stored tensor emitted through a callback in a fixed
// order, and a publish step. Neither driver names a format.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "exec/tensor_copy.h"
#include "model/checkpoint_model.h"

namespace ckpt {

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

// A small file an output publishes beside its data files, by its bytes.
struct MarkerFile {
  std::string path;  // where it goes
  std::string bytes;
  // A pointer beside the output that the job was asked to update
  // (DeepSpeed's latest_universal with --update-latest): put over what is
  // there even without --force, and not removed first by --force, since
  // its old bytes may name another, complete checkpoint.
  bool replace = false;
  // When set, the marker's bytes are this local file's, too large to hold
  // (`bytes` is empty): streamed up as a multipart upload at publishing.
  std::string from_file = {};
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

  // ---- an s3:// OUT (exec/parted_output.h's write_whole) ----
  // Whether this writer publishes to object storage: its data files go to
  // output_path(k) as multipart uploads, then marker_files().
  virtual bool publishes_to_object_store() const { return false; }
  // After the last run(): the files publish() adds beside the data files,
  // in the order they are to appear, the one that makes the output a
  // checkpoint for its reader last (DCP's .metadata, a safetensors index).
  virtual std::vector<MarkerFile> marker_files() const { return {}; }
};

struct PartedOptions {
  std::string path;  // OUT; the shared files and receipts go to OUT.parts-<plan hash>/
  bool force = false;
  bool durable = true;
  CopyOptions copy;
  std::vector<std::string> inputs;  // the source's files: receipts made before one changed are stale
  std::string request;              // the job's request (JSON), kept beside the parts for `ckptconv finalize OUT`
  // Puts what else the output is made of once its objects and markers are
  // published (`published`, in order): an HF folder's side files,
  // config.json last. An s3:// OUT: run by the process that publishes (the
  // one process, or the --part finalizer before it removes the shared
  // state); when it fails, `published` is deleted again. A local --part
  // OUT: run by the finalizer before it removes the parts folder; when it
  // stops there (fails, or is killed), the next finalize resumes with it
  // (exec/part_protocol.cc).
  std::function<void(const std::vector<std::string>& published)> publish_beside;
};

// InvalidArgument ("output exists") when one of the writer's destinations
// is there (a link too, dangling or not): before any work, unless --force.
void refuse_existing(const PartedWriter& writer);

// The unit's size skipped at the sink's position (a gap another process
// fills, or the run against counting sinks); a zip record gets `crc`.
void skip_unit(const PartUnit& unit, ByteSink& sink, archive::ZipWriter* zip, uint32_t crc = 0);

// All of the unit's bytes, at the sink's position.
void write_unit(const PartUnit& unit, ByteSink& sink, archive::ZipWriter* zip, const CopyOptions& copy);

}  // namespace ckpt
