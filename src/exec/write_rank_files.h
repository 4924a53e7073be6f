// Executes a per-rank-files plan (plan_rank_files): for every output rank r
// and every family (model, optimizer), one torch.save file holding the
// family's state dict as rank r of an FSDP1 job at world size N saves it
// under SHARDED_STATE_DICT (docs/formats.md §3): sharded tensors as ShardedTensor
// or DTensor values wrapping rank r's torch.chunk piece of dim 0, other
// tensors (optimizer `step`) whole, every other value as the source has it.
// Each local piece is assembled from the overlapping source ranges only
// (append_tensor, bounded memory). All files go to one AtomicDirectory.
#pragma once

#include <string>
#include <vector>

#include "exec/parted_output.h"
#include "exec/tensor_copy.h"
#include "formats/fsdp_ranks/rank_file_names.h"
#include "formats/torch_pt/sharded_values.h"
#include "model/checkpoint_model.h"
#include "plan/reshard.h"

namespace ckpt {

enum class RankLayout { kShardedTensor, kDTensor };

// The output layout: ShardedTensor or DTensor values; for DTensors, the mesh
// the loading job will compare with its own (device type, dimension names).
struct RankFilesLayout {
  RankLayout values = RankLayout::kShardedTensor;
  torch_pt::MeshInfo mesh;
};

// One family of output files: its name template ("model_rank{r}.pt",
// "optim_world_size_{N}_rank_{r}.pt") and its state dict, a subtree of the
// model's root whose tensor references index model.tensors.
struct RankFamily {
  fsdp_ranks::RankFileName name;
  pickle::ValuePtr root;
};

struct RankFilesOptions {
  std::string dir;
  bool force = false;
  bool durable = true;  // fsync every file before the directory is published (--no-fsync: false)
  CopyOptions copy;
};

// The plan must come from plan_rank_files for these tensors; its world size
// is N. The model must have passed require_valid().
void write_rank_files(const CheckpointModel& model, const std::vector<RankFamily>& families,
                      const RankFilesLayout& layout, const ReshardPlan& plan, const RankFilesOptions& options);

// --part: this worker's share of the files (exec/parted_output.h); the
// finalizing worker publishes the directory.
PartOutcome write_rank_files_part(const CheckpointModel& model, const std::vector<RankFamily>& families,
                                  const RankFilesLayout& layout, const ReshardPlan& plan,
                                  const RankFilesOptions& options, const PartSpec& part, const std::string& request);

// The files each rank will write and their exact sizes, from the writer run
// against counting sinks (no tensor data is read).
std::vector<RankFilesOut> rank_files_sizes(const CheckpointModel& model, const std::vector<RankFamily>& families,
                                           const RankFilesLayout& layout, const ReshardPlan& plan);

// "fsdp-sharded-tensor" / "fsdp-dtensor".
const char* rank_layout_name(RankLayout layout);

}  // namespace ckpt
