// Executes a reshard plan into a DCP directory: one __<r>_0.distcp per
// output rank, each tensor item assembled from the overlapping source
// ranges only (append_tensor, bounded memory), non-tensor items written once
// by rank 0, then .metadata, then the directory renamed into place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exec/parted_output.h"
#include "exec/tensor_copy.h"
#include "formats/dcp/dcp_metadata.h"
#include "model/checkpoint_model.h"
#include "model/tree_walk.h"
#include "plan/reshard.h"

namespace ckpt {

struct DcpOutputOptions {
  std::string dir;
  bool force = false;
  bool durable = true;  // fsync every file before the directory is published (--no-fsync: false)
  CopyOptions copy;
  // Files copied unchanged into the output directory under their own names
  // (Lightning's meta.pt, which its loader reads beside the DCP items).
  std::vector<std::string> side_files = {};
};

// Copies `side_files` unchanged into directory `into` under their own names.
void copy_side_files(const std::vector<std::string>& side_files, const std::string& into);

// `source` is the metadata the model was read from, or flattened_layout()
// of a .pt model (its item order and planner_data are kept). The model must have passed require_valid().
void write_dcp_reshard(const CheckpointModel& model, const dcp::DcpMetadata& source, const ReshardPlan& plan,
                       const DcpOutputOptions& options);

// --part: this worker's share of the rank files (exec/parted_output.h); the
// finalizing worker writes .metadata and publishes the directory.
PartOutcome write_dcp_reshard_part(const CheckpointModel& model, const dcp::DcpMetadata& source,
                                   const ReshardPlan& plan, const DcpOutputOptions& options, const PartSpec& part,
                                   const std::string& request);

// The exact bytes the rank files and .metadata will hold, found by running
// the writer against counting sinks (no tensor data is read).
struct DcpOutputSizes {
  std::vector<uint64_t> files;  // per rank
  uint64_t metadata = 0;
};
DcpOutputSizes dcp_output_sizes(const CheckpointModel& model, const dcp::DcpMetadata& source, const ReshardPlan& plan,
                                const std::string& dir);

// The items and planner_data dcp.save records for the state dict `model.root`
// (a .pt source): flattened as torch's _traverse.traverse_state_dict does —
// dicts are entered (keys become str(key)), a list is entered when it holds
// a tensor or a container that is entered, anything else (a tensor, a
// scalar, a tuple, a list of plain values such as param_groups' `params`) is
// one item keyed by the dotted path. Unimplemented when the root is no dict
// or a tensor sits inside a bytes item (a tuple).
dcp::DcpMetadata flattened_layout(const CheckpointModel& model);

}  // namespace ckpt
