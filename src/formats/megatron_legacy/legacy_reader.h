// Reader of Megatron-LM's legacy checkpoints (ckpt_format=torch,
// megatron/training/checkpointing.py; docs/megatron.md "Legacy checkpoints"):
//
//   ROOT/latest_checkpointed_iteration.txt      "<iteration>" or "release"
//   ROOT/iter_<iteration:07d>/ (or release/)    one checkpoint: this reader's SRC
//       mp_rank_<tp:02d>[_<pp:03d>][_<ep:03d>]/model_optim_rng.pt
//           a torch.save dict per model-parallel rank: args (argparse.
//           Namespace), checkpoint_version, iteration, model (model0..N
//           under virtual pipelining), optimizer, opt_param_scheduler,
//           rng_state, ...
//       (distrib_optim.pt beside it with the distributed optimizer)
//
// The model is given as the TP=1/PP=1 model's state dict: TP pieces merged
// by tp_layout.h, layers renumbered to their global index. --only optim
// gives the optimizer's state per parameter name (optim_layout.h), merged
// the same way.
#pragma once

#include <optional>
#include <string>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::megatron_legacy {

inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kRankFile = "model_optim_rng.pt";
// Beside the rank file under the distributed optimizer: its flat state.
inline constexpr const char* kDistribOptimFile = "distrib_optim.pt";

// A folder holding mp_rank_* rank folders (one iteration of a legacy save).
bool is_iteration_dir(const std::string& dir);
// How many mp_rank_* folders it holds (model-parallel ranks that wrote), for
// a folder listing.
int rank_folder_count(const std::string& dir);

// The folder ROOT's tracker file names: "iter_<N:07d>", or "release";
// nullopt when there is no tracker. DataLoss naming the file when it holds
// neither a number nor "release".
std::optional<std::string> tracker_folder(const std::string& root);

CheckpointModel read_legacy(const std::string& dir, ProblemSink* problems, const std::string& only);

}  // namespace ckpt::megatron_legacy
