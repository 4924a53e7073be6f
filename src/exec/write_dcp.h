// Writes a reshard plan as a DCP directory (DcpWriter, run by either driver
// of exec/parted_output.h), and flattens a .pt state dict into DCP items.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "exec/parted_output.h"
#include "exec/tensor_copy.h"
#include "formats/dcp/dcp_metadata.h"
#include "io/atomic_dir.h"
#include "model/checkpoint_model.h"
#include "model/tree_walk.h"
#include "plan/reshard.h"

namespace ckpt {

// Copies `side_files` unchanged into directory `into` under their own names
// (streamed: an Accelerate folder's files saved whole may be large).
void copy_side_files(const std::vector<std::string>& side_files, const std::string& into);

// The DCP directory `dir` for the plan's world size: a PartedWriter
// (exec/parted_output.h) whose files are the ranks' __<r>_0.distcp, each
// tensor item assembled from the overlapping source ranges only, non-tensor
// items written once by rank 0; its publish writes .metadata (checkpoint_id:
// `dir`) and writes `side_files` (Lightning's meta.pt, which its loader
// reads beside the DCP items; megatron-core's common.pt and metadata.json)
// into the directory it renames into place. `source` is the metadata the model was read from, or
// flattened_layout() of a .pt model (its item order and planner_data are
// kept). The model must have passed require_valid(); model, source and plan
// must outlive the writer.
class DcpWriter final : public PartedWriter {
 public:
  DcpWriter(const CheckpointModel& model, const dcp::DcpMetadata& source, const ReshardPlan& plan, std::string dir,
            std::vector<SideFile> side_files = {});
  std::string kind() const override { return "dcp"; }
  std::vector<std::string> file_names() const override;
  std::vector<std::string> destinations() const override { return {dir_}; }
  std::string output_path(std::size_t k) const override;
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override;
  bool fills_files_in_order() const override { return false; }
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override;
  bool publishes_to_object_store() const override { return true; }
  // The side files, then .metadata.
  std::vector<MarkerFile> marker_files() const override;
  // The exact size of .metadata, after a run (its random save id has a fixed length).
  uint64_t metadata_size() const;

 private:
  const CheckpointModel& model_;
  const dcp::DcpMetadata& source_;
  const ReshardPlan& plan_;
  std::string dir_;
  std::vector<SideFile> side_files_;
  dcp::DcpMetadata metadata_;  // of the last run
};

// The items and planner_data dcp.save records for the state dict `model.root`
// (a .pt source): flattened as torch's _traverse.traverse_state_dict does —
// dicts are entered (keys become str(key)), a list is entered when it holds
// a tensor or a container that is entered, anything else (a tensor, a
// scalar, a tuple, a list of plain values such as param_groups' `params`) is
// one item keyed by the dotted path. Unimplemented when the root is no dict
// or a tensor sits inside a bytes item (a tuple).
dcp::DcpMetadata flattened_layout(const CheckpointModel& model);

}  // namespace ckpt
