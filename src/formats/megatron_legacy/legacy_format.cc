// Megatron-LM legacy (ckpt_format=torch) iteration folders: mp_rank_* rank
// folders, each with its model_optim_rng.pt. The folder of iterations above
// them (latest_checkpointed_iteration.txt) is a checkpoint root
// (formats/checkpoint_root.h), read at the iteration its tracker names.
#include "formats/input_format.h"
#include "formats/megatron_legacy/legacy_reader.h"

namespace ckpt::megatron_legacy {
namespace {

int probe_dir(const std::string& dir) { return is_iteration_dir(dir) ? confidence::kMarker : confidence::kNo; }

CheckpointModel read(const std::string& src, const ReadOptions& options) {
  return read_legacy(src, options.problems, options.only);
}

}  // namespace

const InputFormat& input_format() {
  static const InputFormat f{.kind = SourceKind::kMegatronLegacy,
                             .probe_directory = probe_dir,
                             .read = read,
                             .traits = {},
                             .directory_shape = "Megatron-LM mp_rank_* folders",
                             .description =
                                 "a Megatron-LM ckpt_format=torch iteration folder (iter_<N>/mp_rank_*/"
                                 "model_optim_rng.pt), or the folder above it with --tag"};
  return f;
}

}  // namespace ckpt::megatron_legacy
