// What `reshard --layout megatron` stores (docs/megatron.md): a
// torch_dist checkpoint that megatron-core's dist_checkpointing.load reads
// at any tensor, pipeline and data parallelism. Its tensors are global
// (TP and PP only decide how the saving ranks cut them), so the output is
// the stored view written as DCP items for the new world size, each
// sharded object stored as megatron-core does, and common.pt and
// metadata.json copied unchanged: neither depends on the parallelism.
//
// From a Megatron-LM legacy (ckpt_format=torch) checkpoint read whole, the
// same directory is made from its TP=1/PP=1 model: every run of layers
// stacked into one tensor per parameter (decoder.layers.<rest>, leading
// num_layers axis), named by the layer spec's sharded_state_dict_keys_map
// (the local spec's input_layernorm.weight is stored as
// self_attention.linear_qkv.layer_norm_weight), each layer's _extra_state a
// shard of a sharded object of shape (num_layers,); common.pt made of the
// job's entries (args, iteration, checkpoint_version, ...) and
// metadata.json of megatron-core's torch_dist backend.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "io/atomic_dir.h"
#include "model/checkpoint_model.h"

namespace ckpt::megatron {

struct TorchDistOutput {
  // Root: the DCP items in order. Tensors under their stored keys; each
  // shard of a sharded object as KEY/shard_<offsets>_<shape> holding
  // [value] (megatron-core's torch.save([obj]) of one ShardedObject).
  CheckpointModel items;
  // common.pt and metadata.json, written beside the items: the source's
  // copied, or made from a legacy checkpoint's job entries.
  std::vector<SideFile> side_files;
};

// `stored`: a torch_dist checkpoint read whole (SourceInfo::megatron set),
// or a Megatron-LM legacy checkpoint read whole; InvalidArgument otherwise.
TorchDistOutput torch_dist_output(const CheckpointModel& stored);

// A model in megatron-core's unstacked names (decoder.layers.<i>.<param>,
// what --only model reads and a map's way back writes: a flat dict of
// tensors and None values) as the torch_dist checkpoint megatron-core saves
// of such a model: every decoder.layers.<i>.<param> stacked back on a
// leading layer axis (each layer's chunks at offset i, no byte read), and a
// SequentialMLP's decoder.layers.<i>.<…>.experts.local_experts.<e>.<param>
// on the layer and an expert axis as <…>.experts.experts.<param> (every
// expert at its global index); each None value under a layer (a linear's
// _extra_state) a sharded object of shape (layers[, experts]), and
// common.pt ({}: a model holds no common state) and metadata.json made.
// InvalidArgument for a model whose layers or experts do not stack (one
// missing, shapes or dtypes that differ) or a value outside them.
TorchDistOutput torch_dist_from_model(const CheckpointModel& model);

}  // namespace ckpt::megatron
