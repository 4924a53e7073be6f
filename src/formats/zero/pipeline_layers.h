// DeepSpeed pipeline-parallel checkpoints (deepspeed.pipe.PipelineModule),
// as DeepSpeed 0.19.8 writes them (docs/deepspeed.md, "Pipeline
// parallelism"):
//
//   layer_LL-model_states.pt                  one per layer that has a state dict (PipelineModule.save_state_dict,
//                                             written by data-parallel rank 0 of the layer's stage): the layer's own
//                                             state_dict() in the low-precision dtype, keys without the "LL." prefix
//   mp_rank_SS_model_states.pt                one per stage S (mp rank = the stage): `module` None, param_shapes with
//                                             the PipelineModule's names ("LL.weight"), checkpoint_parallel_dimensions
//   [bf16_]zero_pp_rank_D_mp_rank_SS_optim_states.pt
//                                             ZeRO-1 (the only stage pipelines allow) over the stage's dp group
//
// LL is the layer's global index in the PipelineModule (two digits at
// least); layers without a state dict (plain functions) have no file, so
// the indices have gaps. PipelineModule registers layer LL as the submodule
// "LL", so its state_dict() and load_state_dir name layer LL's entry `k`
// "LL.k": the names param_shapes uses, and the names ckptconv gives.
//
// With a tensor axis in the topology (PipeModelDataParallelTopology, what
// Megatron-DeepSpeed trains with) every file name carries the tensor-parallel
// rank: layer_LL-model_TT-model_states.pt, and mp_rank_MM with MM = stage x
// tp_degree + TT (PipelineParallelGrid's ds_model_rank).
//
// Tied layers (TiedLayerSpec): the module is registered once per stage as
// tied_modules.KEY, ahead of the numbered layers, so param_shapes names its
// parameters "tied_modules.KEY.k" on every stage that uses it, each stage
// keeping its own master (DeepSpeed all-reduces the gradient between them).
// Its layer file is written under each layer index that calls the module
// itself; a layer calling it through forward_fn (a functools.partial, as
// Megatron-DeepSpeed's output layer does) has no state dict and no file, so
// a stage may hold a tied parameter whose state is in another stage's file.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "formats/zero/zero_files.h"

namespace ckpt::zero {

// The layer index of a PipelineModule entry name: "3.weight" -> 3; nullopt
// for names of no numbered layer (TiedLayerSpec's "tied_modules.KEY.*").
std::optional<int> pipeline_layer_of(const std::string& name);

// The key of a tied module's entry: "tied_modules.embed.weight" -> "embed";
// nullopt for any other name.
std::optional<std::string> tied_key_of(const std::string& name);

// The layer files each stage's module is made of, by layer index.
// stage_params[s]: the parameter names of stage s's param_shapes. Every
// layer a parameter names must have its file (else NotFound naming the file
// and the stage); a layer file no parameter names (buffers or frozen
// parameters only, or a tied module's) goes to the stage holding the nearest
// lower layer. Tied modules' parameters name no layer. `tp`: the
// tensor-parallel rank the files are of (-1: no tensor axis), for the names.
std::vector<std::vector<int>> stage_layers(const std::vector<std::vector<std::string>>& stage_params,
                                           const std::map<int, std::string>& layer_files, const std::string& dir,
                                           int tp = -1);

// The tied module a layer file holds: the key KEY whose entries among
// `names` (the stages' param_shapes and buffer names, "tied_modules.KEY.k")
// are exactly the file's keys `file_keys`; nullopt when no key's are. Two
// keys fitting is Unimplemented (exit 3) naming `path`: nothing else says
// which module the file is.
std::optional<std::string> tied_key_of_layer(const std::set<std::string>& file_keys, const std::set<std::string>& names,
                                             const std::string& path);

// The entries of decoded layer file `file`, named `prefix` + k as
// PipelineModule's state_dict() names them ("LL." for layer LL,
// "tied_modules.KEY." for a tied module's), appended to `out`.
void append_layer_entries(std::vector<ModuleEntry>& out, const std::string& prefix, const Decoded& file);

// The keys of decoded layer file `file`'s state dict.
std::set<std::string> layer_file_keys(const Decoded& file);

// "layer_03-model_states.pt": the file name DeepSpeed gives layer 3; with a
// tensor-parallel rank `tp` >= 0, "layer_03-model_01-model_states.pt".
std::string layer_file_name(int layer, int tp = -1);

}  // namespace ckpt::zero
