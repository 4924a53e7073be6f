// A torch.save file whose top-level entries may hold a training script's own
// objects (DeepSpeed's client_state, Megatron-LM's args in common.pt),
// decoded under the quarantine: a global the checkpoint policy does not know
// is recorded, never called, and the entry naming it is refused (exit 3,
// naming entry and global) or, when --only selects a view that does not
// need it, dropped with a warning (docs/deepspeed.md "client_state").
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::torch_pt {

// One decoded file: its tree (a dict) and the tensors it references.
struct QuarantinedPt {
  std::string path;
  int rank = -1;
  pickle::ValuePtr root;
  std::vector<TensorEntry> tensors;

  const TensorEntry& tensor(const pickle::Value& ref, const std::string& what) const {
    auto idx = tensor_ref_index(ref);
    if (!idx) fail_data_loss(what + " is not a tensor");
    return tensors.at(*idx);
  }
};

// "module.name" of the first global under `v` the checkpoint policy does
// not know (recorded by the quarantine); empty when there is none.
std::string unknown_global_in(const pickle::Value& v);

// `path` (of `rank`, -1 when none) decoded; its root must be a dict, else
// DataLoss "not <expected>". A top-level entry naming an unknown global is
// refused when `only` is empty or `reader_uses(key)`, else dropped with a
// warning; `unknown_entries` says in the refusal what such entries are.
QuarantinedPt decode_quarantined(const std::string& path, int rank, ProblemSink* problems, const std::string& only,
                                 const std::function<bool(const std::string& key)>& reader_uses,
                                 std::string_view unknown_entries, std::string_view expected);

}  // namespace ckpt::torch_pt
