// The pickled files of DeepSpeed checkpoints, decoded for the readers of
// ZeRO checkpoints (zero_reader.cc) and universal checkpoints
// (formats/ds_universal/): each file with the quarantine policy (a script's
// own objects in client_state are recorded, never called, and refused or,
// under --only, dropped by entry), element ranges of flat partitions as
// chunks, and the training state a job resumes its schedule from.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/problems.h"
#include "formats/torch_pt/quarantined_pt.h"
#include "model/checkpoint_model.h"

namespace ckpt::zero {

// One decoded .pt (formats/torch_pt/quarantined_pt.h).
using Decoded = torch_pt::QuarantinedPt;

// `path` (of `rank`, -1 when none) decoded under the quarantine; its root
// must be a dict. An entry naming a global the checkpoint policy does not
// know is refused (exit 3) naming it, unless `only` is set and the entry is
// none a DeepSpeed reader uses: then it is dropped with a warning.
// `unknown_entries` says in the message what such entries are.
Decoded decode(const std::string& path, int rank, ProblemSink* problems, const std::string& only,
               std::string_view unknown_entries = "client_state the training script saved");

// One entry of the module state dict a ZeRO checkpoint saved, and the file
// it is in: the model-states file's `module`, or a pipeline's layer files
// (where `module` is None and layer LL's entry `k` is the module's `LL.k`).
struct ModuleEntry {
  std::string name;
  const Decoded* file = nullptr;
  const pickle::Value* value = nullptr;
};

// The dict of a value (an OrderedDict with attributes is BUILD on it).
const pickle::Value& as_dict(const pickle::Value& v);
// v[key]; DataLoss naming `file` when absent.
pickle::ValuePtr at(const pickle::Value& v, std::string_view key, const std::string& file);

// `out` (its shape set) as ZeRO-3 keeps a frozen parameter: ceil(numel/ws)
// elements in each rank's fragment, rank r's in frags[r] (read from its
// model-states file paths[r]), the last rank's padded.
void add_stage3_fragments(TensorEntry& out, const std::vector<const TensorEntry*>& frags,
                          const std::vector<std::string>& paths);

// Tensor `ref` of `d` appended to `model` under `name`; its index.
std::size_t copy_tensor(CheckpointModel& model, const Decoded& d, const pickle::Value& ref, const std::string& name);

// lr_scheduler, global_steps, global_samples, skipped_steps and
// client_state from the model-states file `m0`, appended to model.root.
void add_training_state(CheckpointModel& model, const Decoded& m0);

}  // namespace ckpt::zero
