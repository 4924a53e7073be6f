// The per-rank files an FSDP1 job at world size N saves the fast way
// (formats/fsdp_flat/flat_params.h, docs/formats.md §3b), planned from a
// full training state dict and the source's FSDP1 structure (the units,
// use_orig_params, the tied names): what the job loads with
//
//   with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
//       model.load_state_dict(torch.load(f"model_rank{r}.pt"))
//   optim.load_state_dict(torch.load(f"optim_rank{r}.pt"))
//
//   model_rank{r}.pt  each unit's `<prefix>_flat_param` as a 1-D ShardedTensor
//                     of the flat parameter at world size N (rank r's
//                     torch.chunk piece), buffers whole; with
//                     use_orig_params=True also each parameter's 1-D view of
//                     rank r's shard, as FSDP saves and loads them;
//   optim_rank{r}.pt  the raw optim.state_dict(): integer ids (one per unit,
//                     or one per parameter with use_orig_params=True), each
//                     per-element state rank r's 1-D slice (the unit's
//                     padded shard, or the parameter's part), scalars
//                     (`step`) as they are, param_groups with ids.
//
// Padding (alignment and world size) is written as zeros: FSDP never reads
// it as a parameter. Pure: no I/O; exec/write_fsdp1_flat.h writes the plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/rank_file_names.h"
#include "formats/torch_pt/pt_writer.h"
#include "model/checkpoint_model.h"

namespace ckpt::fsdp_flat {

// One torch.save file; sources[i] is what the copy engine reads for
// tensors[i] (slices of the model's tensors and zero padding).
struct FlatFile {
  std::string path;  // "model_rank0.pt"
  pickle::ValuePtr root;
  std::vector<torch_pt::OutputTensor> tensors;
  std::vector<TensorEntry> sources;

  uint64_t tensor_bytes() const {
    uint64_t n = 0;
    for (const auto& t : tensors) n += shape_numel(t.shape) * dtype_size(t.dtype);
    return n;
  }
};

struct FlatPlan {
  std::vector<FlatFile> files;  // per rank: the model file, then the optimizer file
  uint64_t tensor_bytes = 0;
};

// `model`'s root is {"model": ..., "optim": ...} (either may be absent); the
// files are named as the families `model_name` and `optim_name` name them at
// this world size. InvalidArgument naming the
// entry when the state dict does not fit `layout` (a unit's parameter
// missing, a param group splitting a unit, state of another shape).
FlatPlan plan_fsdp1_flat(const CheckpointModel& model, const Fsdp1Layout& layout, int world_size,
                         const fsdp_ranks::RankFileName& model_name, const fsdp_ranks::RankFileName& optim_name);

}  // namespace ckpt::fsdp_flat
