// Executes a per-rank-files plan (plan_rank_files): for every output rank r
// and every family (model, optimizer), one torch.save file holding the
// family's state dict as rank r of an FSDP1 job at world size N saves it
// under SHARDED_STATE_DICT (docs/formats.md §3): sharded tensors as ShardedTensor
// or DTensor values wrapping rank r's torch.chunk piece of dim 0, other
// tensors (optimizer `step`) whole, every other value as the source has it.
// Each local piece is assembled from the overlapping source ranges only
// (append_tensor, bounded memory). The directory is published whole.
#pragma once

#include <string>
#include <vector>

#include "exec/parted_output.h"
#include "exec/tensor_copy.h"
#include "formats/rank_file_names.h"
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

// Every output rank's files in directory `dir`, a PartedWriter
// (exec/parted_output.h): for rank r and each family, in that order, its
// file named by the family's template at the plan's world size N. The plan
// must come from plan_rank_files for these tensors, the model must have
// passed require_valid(); both, the families and the layout must outlive
// the writer.
class RankFilesWriter final : public PartedWriter {
 public:
  RankFilesWriter(const CheckpointModel& model, const std::vector<RankFamily>& families, const RankFilesLayout& layout,
                  const ReshardPlan& plan, std::string dir);
  std::string kind() const override;
  std::vector<std::string> file_names() const override { return names_; }
  std::vector<std::string> destinations() const override { return {dir_}; }
  std::string output_path(std::size_t k) const override { return dir_ + "/" + names_.at(k); }
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override;
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override;
  bool publishes_to_object_store() const override { return true; }  // no marker: the files are the checkpoint

 private:
  const CheckpointModel& model_;
  const std::vector<RankFamily>& families_;
  const RankFilesLayout& layout_;
  const ReshardPlan& plan_;
  std::string dir_;
  std::vector<std::string> names_;
};

// "fsdp-sharded-tensor" / "fsdp-dtensor".
const char* rank_layout_name(RankLayout layout);

}  // namespace ckpt
