// Reader of torch.distributed.checkpoint directories: `.metadata` plus
// `__<rank>_<n>.distcp` files whose items are complete torch.save archives
// at [offset, offset+length). Builds the CheckpointModel whose structure is
// the nested dict dcp_to_torch_save would produce (rebuilt through
// planner_data) and whose tensors point at each chunk's bytes in place.
#pragma once

#include <string>

#include "core/problems.h"
#include "formats/dcp/dcp_metadata.h"
#include "model/checkpoint_model.h"
#include "pickle/policy.h"

namespace ckpt {
// The model directory inside a kDcpPair folder (Accelerate names its i-th
// model pytorch_model_fsdp_<i> and optimizer optimizer_<i>).
inline constexpr const char* dcp_pair_model_dir = "pytorch_model_fsdp_0";
}  // namespace ckpt

namespace ckpt::dcp {

// `sink` (validate): every record's CRC-32 is verified, and each problem the
// reader can continue past (an item that does not decode, a missing or
// unreadable .distcp, overlapping items, a .distcp the metadata does not
// name, rank metadata files that disagree) is reported there instead of
// thrown; the model holds the items that could be read.
// `bytes_policy`: what a bytes item's pickle may name (a QuarantinePolicy
// for a format whose job-state items the caller screens: Megatron's).
CheckpointModel read_dcp_dir(const std::string& dir, ProblemSink* sink = nullptr,
                             const pickle::GlobalPolicy& bytes_policy = pickle::checkpoint_policy());

// A folder holding the model and the optimizer as separate DCP directories,
// as Accelerate's save_state writes them (pytorch_model_fsdp_<i>/ and
// optimizer_<i>/; sampler.bin and random_states_*.pkl beside them are not
// read): {"model": the model's state dict, "optim": the optimizer's}, keys
// model_<i>/optim_<i> for i > 0.
CheckpointModel read_dcp_pair(const std::string& dir, ProblemSink* sink = nullptr);

}  // namespace ckpt::dcp
