// DeepSpeed ZeRO checkpoints: the folder holding `latest`, or a tag folder.
#include "formats/input_format.h"
#include "formats/zero/zero_reader.h"

namespace ckpt::zero {
namespace {

int probe_dir(const std::string& dir) { return is_zero_checkpoint(dir) ? confidence::kMarker : confidence::kNo; }

CheckpointModel read(const std::string& src, const ReadOptions& options) {
  return read_zero(src, options.tag, options.only, options.problems);
}

}  // namespace

const InputFormat& input_format() {
  // Read whole ({"model", "optim", ...}): plan/select applies --only.
  static const InputFormat f{.kind = SourceKind::kZero,
                             .probe_directory = probe_dir,
                             .read = read,
                             .directory_shape = "DeepSpeed `latest` or *_model_states.pt",
                             .description =
                                 "the folder holding `latest`, or a tag folder (--tag picks another "
                                 "tag)"};
  return f;
}

}  // namespace ckpt::zero
