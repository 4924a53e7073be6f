// Tied weights of a Hugging Face model folder. save_pretrained stores a tied
// weight once: with `tie_word_embeddings` the output head (lm_head.weight)
// is the input embedding, and only the embedding is in the files, while
// model.state_dict() (what an FSDP job's dcp.load asks for) holds both keys.
//
// Which keys are tied is in the model's code (transformers'
// `_tied_weights_keys`), not in the folder; ckptconv knows it from
// config.json and a table of the pairs of decoder language models (the
// output head <- the input embedding: model.embed_tokens.weight for
// Llama/Mistral/Qwen/Gemma-style models, transformer.wte.weight for GPT-2,
// ...). It adds the head as a second reference to the embedding's tensor,
// so every output that names keys (DCP, per-rank files, .pt) holds it,
// while safetensors outputs store the tensor once, as save_pretrained does.
// Nothing is guessed: where config.json ties the embeddings and no pair of
// the table fits the stored tensors, a warning naming config.json says so.
#pragma once

#include <string>
#include <vector>

#include "formats/safetensors/hf_config.h"
#include "model/checkpoint_model.h"

namespace ckpt::safetensors {

struct TiedPair {
  const char* head;       // the key save_pretrained leaves out
  const char* embedding;  // the key it stores, whose tensor the head is
};
// The pairs known (transformers' `_tied_weights_keys` of the decoder models).
const std::vector<TiedPair>& known_tied_pairs();

// The folder's config.json decides (`tie_word_embeddings`, or the same key in its
// `text_config`; absent: transformers' PretrainedConfig default, true). The
// model's root must be a flat state dict; each head added is recorded in
// facts["hf_tied_weights"] ("lm_head.weight = model.embed_tokens.weight").
void add_tied_weights(CheckpointModel& model, const HfConfig& config);

}  // namespace ckpt::safetensors
