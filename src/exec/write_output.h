// Writes a CheckpointModel as one output file, atomically: the destination
// appears complete or not at all.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "exec/part_protocol.h"
#include "exec/tensor_copy.h"
#include "formats/torch_pt/pt_writer.h"
#include "model/checkpoint_model.h"

namespace ckpt {

struct OutputOptions {
  std::string path;
  bool force = false;   // overwrite an existing output
  bool durable = true;  // fsync before the rename that publishes the output (--no-fsync: false)
  CopyOptions copy;
  uint64_t max_shard_size = 0;  // safetensors: split into shards of at most this many bytes (0: one file)
  bool gzip = false;            // HDF5: shuffle + deflate
  // PartedOptions::publish_beside (an HF folder's side files): an s3:// OUT,
  // or a local --part one.
  std::function<void(const std::vector<std::string>& published)> publish_beside;
};

enum class OutputFormat { kPt, kSafetensors, kHdf5 };

// An output format's descriptor: its names, what it can do, and its
// one-process writer. Jobs ask these instead of naming a format.
struct OutputFormatInfo {
  OutputFormat id;
  std::string_view name;                     // --format NAME, and in reports
  std::vector<std::string_view> aliases;     // other --format spellings
  std::vector<std::string_view> extensions;  // lower case, with the dot; the first is the usual one
  std::string_view weights_file;             // -o DIR/ of a model alone (as Hugging Face tools name it)
  std::string_view full_file;                // -o DIR/ of more than a model
  bool shards = false;                       // --max-shard-size
  bool compression = false;                  // --compression
  // Its writer (exec/parted_writer.h), which one process runs (write_whole)
  // or several, each writing its share (--part).
  std::unique_ptr<PartedWriter> (*parted)(const CheckpointModel& model, const OutputOptions& options) = nullptr;
  // Only for a format whose library writes the file by name (HDF5), so that
  // it has no PartedWriter: its whole writer, returning the files written.
  std::vector<std::string> (*write)(const CheckpointModel& model, const OutputOptions& options) = nullptr;
};

// Every output format, in --format's order.
const std::vector<OutputFormatInfo>& output_formats();
const OutputFormatInfo& output_format_info(OutputFormat format);

// "pt", "safetensors", "hdf5" (also "h5"); nullopt otherwise.
std::optional<OutputFormat> output_format_from_name(const std::string& name);
// By the path's extension: .pt/.pth/.bin, .safetensors, .h5/.hdf5; nullopt otherwise.
std::optional<OutputFormat> output_format_from_path(const std::string& path);
const char* output_format_name(OutputFormat format);
// ".pt, .pth, .bin (pt), .safetensors (safetensors), ...": for messages.
std::string output_extensions_text();

// Writes the model in `format`, by its PartedWriter run in one process
// (exec/parted_output.h's write_whole) or, for HDF5, its own writer, and
// returns the files written, in order: OUT itself, or for a sharded
// safetensors output its shards then OUT.index.json. Validates the model
// first. A failure or an interrupt leaves nothing at the destination.
std::vector<std::string> write_output(const CheckpointModel& model, OutputFormat format, const OutputOptions& options);

// .pt and .safetensors outputs of consolidate/convert written by several
// processes (--part; exec/part_protocol.h); HDF5 is refused.
PartOutcome write_output_part(const CheckpointModel& model, OutputFormat format, const OutputOptions& options,
                              const PartSpec& part, const std::string& request);

// The tensors of a .pt output as torch_pt::write_pt takes them (output
// dtype, shape, Parameter or not), for every writer of that format.
std::vector<torch_pt::OutputTensor> pt_output_tensors(const CheckpointModel& model);

}  // namespace ckpt
