// The DCP input formats: a DCP directory, and Accelerate's pair of them
// (pytorch_model_fsdp_0/ and optimizer_0/ in one checkpoint folder).
#include <filesystem>

#include "formats/dcp/dcp_reader.h"
#include "formats/input_format.h"
#include "io/storage.h"

namespace ckpt::dcp {
namespace {
namespace fs = std::filesystem;

// A global .metadata, or per-rank __<rank>.metadata files when it was saved
// without rank coordination.
bool has_dcp_metadata(const fs::path& dir) {
  return stat_path((dir / ".metadata").string()).resolves() || stat_path((dir / "__0.metadata").string()).resolves();
}

int probe_dir(const std::string& dir) { return has_dcp_metadata(dir) ? confidence::kMarker : confidence::kNo; }

int probe_pair(const std::string& dir) {
  return has_dcp_metadata(fs::path(dir) / dcp_pair_model_dir) ? confidence::kNested : confidence::kNo;
}

CheckpointModel read_dir(const std::string& src, const ReadOptions& options) {
  return read_dcp_dir(src, options.problems);
}

CheckpointModel read_pair(const std::string& src, const ReadOptions& options) {
  return read_dcp_pair(src, options.problems);
}

}  // namespace

const InputFormat& dir_format() {
  static const InputFormat f{.kind = SourceKind::kDcpDir,
                             .probe_directory = probe_dir,
                             .read = read_dir,
                             .traits = {.sharded_layout = true, .reshard_layout = "dcp"},
                             .directory_shape = "DCP .metadata",
                             .description = "a directory with .metadata (or per-rank __<r>.metadata)"};
  return f;
}

const InputFormat& pair_format() {
  static const InputFormat f{.kind = SourceKind::kDcpPair,
                             .probe_directory = probe_pair,
                             .read = read_pair,
                             .traits = {.sharded_layout = true, .reshard_layout = "accelerate"},
                             .directory_shape = "Accelerate pytorch_model_fsdp_0/",
                             .description = "a folder holding pytorch_model_fsdp_0/ and optimizer_0/"};
  return f;
}

}  // namespace ckpt::dcp
