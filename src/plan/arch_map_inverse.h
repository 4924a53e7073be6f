// The way back (docs/maps.md): an architecture map applied in the other
// direction, a Hugging Face model's tensors rewritten in the training
// framework's names and layouts (LlamaForCausalLM as a Megatron-core GPT, or
// as torchtitan's Llama 3), from the same JSON map as the export.
//
// Each operation of a map has an exact inverse on chunks, so the way back
// reads no byte either:
//   rename        the name back;
//   split         concat: the targets' rows put back block by block (per
//                 query group its query heads, its key, its value; [gate; up]);
//   unpad R       the R rows, then zero rows up to the padded vocabulary
//                 (a multiple of `pad_multiple`): the padding's values are
//                 not in the Hugging Face folder, and no token id reaches a
//                 padded row, so zeros are as good as any (they are bytes
//                 ckptconv makes, not copies);
//   permute_rope  half-split rotary pairs back to interleaved ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint_model.h"
#include "plan/arch_map.h"

namespace ckpt {

// The runs of permute_rope's inverse, from half-split rotary pairs (rows i,
// i + head_dim/2 a pair) to interleaved ones (rows 2i, 2i+1): per head and
// pair one run of 2 rows, head_dim/2 apart.
std::vector<RowRun> half_to_interleaved_runs(int64_t rows, int64_t head_dim);

// Rows taken from several tensors, one after another: each part's run of
// its source's dim-0 rows (step 1). The parts must share a dtype and their
// other dims (DataLoss naming them otherwise).
struct RowPart {
  const TensorEntry* source;
  RowRun run;
};
TensorEntry concat_rows(const std::vector<RowPart>& parts, const std::string& name);

// `t` with zero rows appended up to `rows` (a chunk of zeros ckptconv makes).
TensorEntry pad_rows(const TensorEntry& t, int64_t rows, const std::string& name);

// The model `map` maps back from `model` (a flat dict of the map's target
// names: a Hugging Face folder): every rule's targets present for every
// index the config counts (else NotFound naming the tensor), each with the
// shape the config gives (else DataLoss naming it and the fields), every
// tensor of the model used by a rule (else Unimplemented naming it: an
// optimizer's state or another model's tensors have no place in the
// framework's model), then back_none's entries as None. The source names
// are each rule's first `from` (the spec megatron-core 0.16 and torchtitan
// 0.3 save). `pad_multiple`: unpad's inverse pads to a multiple of it.
// Whether `model` holds every target of `map`'s rules at index 0 of each
// placeholder (rules that are optional or off left out): how the way back
// with no --map tells a folder of fused experts from one of per-expert
// tensors. Reads no byte.
bool holds_map_targets(const CheckpointModel& model, const ArchMap& map, const ConfigFields& config,
                       const std::string& config_name);

CheckpointModel apply_arch_map_back(const CheckpointModel& model, const ArchMap& map, const ConfigFields& config,
                                    const std::string& config_name, int64_t pad_multiple);

}  // namespace ckpt
