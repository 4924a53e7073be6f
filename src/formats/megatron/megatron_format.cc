// Megatron-core dist_checkpointing directories: metadata.json beside the
// backend's files. A torch_dist one is also a DCP directory, so it answers
// above plain DCP.
#include "formats/input_format.h"
#include "formats/megatron/megatron_reader.h"

namespace ckpt::megatron {
namespace {

int probe_dir(const std::string& dir) { return is_dist_checkpoint(dir) ? confidence::kRefines : confidence::kNo; }

CheckpointModel read(const std::string& src, const ReadOptions& options) {
  return read_torch_dist(src, options.problems, options.only);
}

}  // namespace

const InputFormat& input_format() {
  static const InputFormat f{.kind = SourceKind::kMegatron,
                             .probe_directory = probe_dir,
                             .read = read,
                             // Resharded, it stays a torch_dist checkpoint unless --layout says otherwise.
                             .traits = {.sharded_layout = true, .reshard_layout = "megatron"},
                             .directory_shape = "Megatron-core metadata.json",
                             .description = "a dist_checkpointing directory (metadata.json beside DCP files)"};
  return f;
}

}  // namespace ckpt::megatron
