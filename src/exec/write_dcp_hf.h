// Executes a reshard plan into torch's DCP Hugging Face layout: per output
// rank one safetensors file of its pieces (formats/dcp_hf/dcp_hf_writer.h),
// what HuggingFaceStorageWriter(save_distributed=True) writes from an FSDP2
// job at that world size; HuggingFaceStorageReader + dcp.load read it and
// consolidate_safetensors_files consolidates it. The directory appears whole
// or not at all (io/atomic_dir).
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

struct DcpHfOutputOptions {
  std::string dir;
  bool force = false;
  bool durable = true;  // fsync every file before the directory is published (--no-fsync: false)
  CopyOptions copy;
};

// Per output rank, its pieces under the keys dcp.save gives the state dict
// (flattened_layout), each Piece::index the item's index in plan.ranks[r].
// InvalidArgument naming the key when an item is not a tensor: the layout
// holds tensors only.
std::vector<std::vector<dcp_hf::Piece>> dcp_hf_pieces(const CheckpointModel& model, const ReshardPlan& plan);

// The files and their exact sizes, per rank (none for a rank with no pieces).
std::vector<std::vector<std::pair<std::string, uint64_t>>> dcp_hf_output_sizes(
    const std::vector<std::vector<dcp_hf::Piece>>& pieces);

void write_dcp_hf_reshard(const CheckpointModel& model, const ReshardPlan& plan,
                          const std::vector<std::vector<dcp_hf::Piece>>& pieces, const DcpHfOutputOptions& options);

// --part: this worker's share of the files (exec/parted_output.h); the
// finalizing worker publishes the directory.
PartOutcome write_dcp_hf_reshard_part(const CheckpointModel& model, const ReshardPlan& plan,
                                      const std::vector<std::vector<dcp_hf::Piece>>& pieces,
                                      const DcpHfOutputOptions& options, const PartSpec& part,
                                      const std::string& request);

}  // namespace ckpt
