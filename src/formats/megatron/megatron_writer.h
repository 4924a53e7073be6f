// What `reshard --layout megatron` stores (docs/megatron.md): a
// torch_dist checkpoint that megatron-core's dist_checkpointing.load reads
// at any tensor, pipeline and data parallelism. Its tensors are global
// (TP and PP only decide how the saving ranks cut them), so the output is
// the stored view written as DCP items for the new world size, each
// sharded object stored as megatron-core does, and common.pt and
// metadata.json copied unchanged: neither depends on the parallelism.
#pragma once

#include <string>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt::megatron {

struct TorchDistOutput {
  // Root: the DCP items in order. Tensors under their stored keys; each
  // shard of a sharded object as KEY/shard_<offsets>_<shape> holding
  // [value] (megatron-core's torch.save([obj]) of one ShardedObject).
  CheckpointModel items;
  // The source's common.pt and metadata.json, copied beside the items.
  std::vector<std::string> side_files;
};

// `stored`: a torch_dist checkpoint read whole (SourceInfo::megatron set);
// InvalidArgument otherwise.
TorchDistOutput torch_dist_output(const CheckpointModel& stored);

}  // namespace ckpt::megatron
