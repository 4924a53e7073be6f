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
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/zero/zero_files.h"

namespace ckpt::zero {

// The layer index of a PipelineModule entry name: "3.weight" -> 3; nullopt
// for names of no numbered layer (TiedLayerSpec's "tied_modules.KEY.*").
std::optional<int> pipeline_layer_of(const std::string& name);

// The layer files each stage's module is made of, by layer index.
// stage_params[s]: the parameter names of stage s's param_shapes. Every
// layer a parameter names must have its file (else NotFound naming the file
// and the stage); a layer file no parameter names (buffers or frozen
// parameters only) goes to the stage holding the nearest lower layer.
std::vector<std::vector<int>> stage_layers(const std::vector<std::vector<std::string>>& stage_params,
                                           const std::map<int, std::string>& layer_files, const std::string& dir);

// The entries of decoded layer file `file` of layer `layer`, named "LL.k"
// as PipelineModule's state_dict() names them, appended to `out`.
void append_layer_entries(std::vector<ModuleEntry>& out, int layer, const Decoded& file);

// "layer_03-model_states.pt": the file name DeepSpeed gives layer 3.
std::string layer_file_name(int layer);

}  // namespace ckpt::zero
