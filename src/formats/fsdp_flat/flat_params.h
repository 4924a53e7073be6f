// FSDP1 flat parameters unflattened (docs/formats.md "FSDP1 flat
// parameters"): the per-rank files an FSDP1 job writes the fast way,
//
//   model  model.state_dict() under LOCAL_STATE_DICT: each FSDP unit's
//          `<prefix>_flat_param`, a 1-D ShardedTensor of the unit's flat
//          parameter, buffers as plain tensors (and, with
//          use_orig_params=True, each parameter's 1-D view of this rank's
//          shard, which is redundant and left out);
//   optim  optim.state_dict(): integer ids, each per-element tensor the
//          rank's 1-D slice of a flat parameter (use_orig_params=False, one
//          id per unit, the slice padded) or of an original parameter
//          (True, one id per parameter),
//
// read as the FQN-keyed state dicts FULL_STATE_DICT and
// FSDP.optim_state_dict(model, optim) give for the same job. What the files
// lack, the names, shapes and registration order of the parameters, comes
// from the layout checkpoint (--param-layout FILE: any checkpoint of the same
// model whose state dict keeps module order; tied weights are known where it
// shares their storage, as torch.save does). The unit boundaries come from
// the `_flat_param` keys. FSDP's rules (torch/distributed/fsdp/_flat_param.py,
// the same from torch 2.4 to 2.15):
//
//   - a unit's flat parameter holds its own parameters (not those of nested
//     units; a shared one only at its first use) in registration order
//     (named_modules pre-order, each module's direct parameters), which is
//     state_dict order;
//   - with use_orig_params=True each parameter starts at a multiple of
//     16 bytes of the forward dtype (4 elements for fp32, 8 for bf16
//     compute), padding between, and the whole is padded to a multiple of
//     the world size; that numel is the ShardedTensor's global numel. With
//     False there is no padding inside, and the global numel is the sum;
//   - rank r holds elements [r*c, r*c + c) with c = ceil(numel / world size)
//     (torch.chunk), the last ranks' slices padded to c in the optimizer.
//
// Nothing is guessed: every unit's numel must come out exactly for one
// alignment, every rank's shard and every optimizer slice must have the
// length the layout gives; otherwise DataLoss (exit 3) names the unit or id,
// the expected and found numel and the likely cause.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt::fsdp_flat {

// Where FSDP puts parameters of `numels` elements in a flat parameter:
// each one's first element, aligned to `alignment` elements (0: none, as
// use_orig_params=False), and the total, with use_orig_params=True's
// padding to a multiple of `world_size`.
struct FlatOffsets {
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
};
FlatOffsets flat_offsets(const std::vector<uint64_t>& numels, int alignment, int world_size);

// One rank's file of a family, decoded and not merged with the others.
struct RankFile {
  std::string path;
  int rank = -1;
  const CheckpointModel* model = nullptr;
};

// A LOCAL_STATE_DICT model file: some key `…_flat_param` holds a ShardedTensor.
bool holds_flat_params(const CheckpointModel& model);
// A raw optim.state_dict() of an FSDP1 model: state keyed by integer ids
// holding plain 1-D tensors (a non-FSDP or FSDP.optim_state_dict file holds
// full-shaped or sharded ones).
bool holds_flat_optimizer_state(const CheckpointModel& model);

struct Inputs {
  std::vector<RankFile> model;  // LOCAL_STATE_DICT files, one per rank, by rank
  std::vector<RankFile> optim;  // raw optimizer files, one per rank, by rank (empty: none)
  int world_size = 0;
  bool want_model = true;  // --only optim reads the model files for their units but gives the optimizer alone
  bool want_optim = true;
};

// The full state dicts: {"model": ..., "optim": ...}, or one of them alone.
// `layout` is the --param-layout checkpoint, read; its tensors' data is
// never read.
CheckpointModel unflatten(const Inputs& in, const CheckpointModel& layout, const std::string& layout_path);

}  // namespace ckpt::fsdp_flat
