// Executes a reshard plan into torch's DCP Hugging Face layout: per output
// rank one safetensors file of its pieces (formats/dcp_hf/dcp_hf_writer.h),
// what HuggingFaceStorageWriter(save_distributed=True) writes from an FSDP2
// job at that world size; HuggingFaceStorageReader + dcp.load read it and
// consolidate_safetensors_files consolidates it. The directory appears whole
// or not at all.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "exec/parted_output.h"
#include "exec/tensor_copy.h"
#include "formats/dcp_hf/dcp_hf_writer.h"
#include "model/checkpoint_model.h"
#include "plan/reshard.h"

namespace ckpt {

// Per output rank, its pieces under the keys dcp.save gives the state dict
// (flattened_layout), each Piece::index the item's index in plan.ranks[r].
// InvalidArgument naming the key when an item is not a tensor: the layout
// holds tensors only.
std::vector<std::vector<dcp_hf::Piece>> dcp_hf_pieces(const CheckpointModel& model, const ReshardPlan& plan);

// One safetensors file per rank that holds a piece (torch writes none for
// an empty save plan) in directory `dir`, a PartedWriter
// (exec/parted_output.h). `pieces` come from dcp_hf_pieces for this plan.
class DcpHfWriter final : public PartedWriter {
 public:
  DcpHfWriter(const CheckpointModel& model, const ReshardPlan& plan,
              const std::vector<std::vector<dcp_hf::Piece>>& pieces, std::string dir);
  std::string kind() const override { return "dcp-hf"; }
  std::vector<std::string> file_names() const override;
  std::vector<std::string> destinations() const override { return {dir_}; }
  std::string output_path(std::size_t k) const override { return dir_ + "/" + files_.at(k).file_name; }
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override;
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override;
  bool publishes_to_object_store() const override { return true; }  // no marker: the files are the checkpoint
  // The output rank file k holds.
  int rank_of(std::size_t k) const { return ranks_.at(k); }

 private:
  std::string dir_;
  std::vector<safetensors::FilePlan> files_;
  std::vector<int> ranks_;                         // per file
  std::vector<std::vector<TensorEntry>> sources_;  // per file, by item index in its rank's plan
};

}  // namespace ckpt
