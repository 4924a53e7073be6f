// DeepSpeed universal checkpoints: a tag folder (zero/ beside the
// model-states files) or the folder whose latest_universal names one.
#include "formats/ds_universal/ds_universal_reader.h"
#include "formats/input_format.h"

namespace ckpt::ds_universal {
namespace {

// A refinement of a ZeRO tag folder (it holds *_model_states.pt too).
int probe_dir(const std::string& dir) { return is_universal_checkpoint(dir) ? confidence::kRefines : confidence::kNo; }

CheckpointModel read(const std::string& src, const ReadOptions& options) {
  return read_universal(src, options.problems, options.only);
}

}  // namespace

const InputFormat& input_format() {
  // Resharded, it stays a universal checkpoint unless --layout says otherwise.
  static const InputFormat f{.kind = SourceKind::kDsUniversal,
                             .probe_directory = probe_dir,
                             .read = read,
                             .traits = {.sharded_layout = true, .reshard_layout = "deepspeed-universal"},
                             .directory_shape = "DeepSpeed universal zero/optimizer_state.pt or latest_universal",
                             .description =
                                 "a tag folder holding zero/, or the folder whose latest_universal "
                                 "names one"};
  return f;
}

}  // namespace ckpt::ds_universal
