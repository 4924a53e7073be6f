#include "formats/safetensors/hf_tied_weights.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "formats/safetensors/hf_config.h"
#include "model/ordered_json.h"
#include "model/tree_walk.h"

namespace ckpt::safetensors {
namespace {

using Json = nlohmann::ordered_json;

struct TieSetting {
  std::optional<bool> value;  // nullopt: the key is absent
  std::string key;            // "tie_word_embeddings" or "text_config.tie_word_embeddings"
};

TieSetting tie_setting(const Json& config) {
  JsonMembers top(config, "config.json");
  if (const Json* v = top.find("tie_word_embeddings"); v && v->is_boolean())
    return {v->get<bool>(), "tie_word_embeddings"};
  if (const Json* text = top.find("text_config"); text && text->is_object()) {
    JsonMembers inner(*text, "config.json text_config");
    if (const Json* v = inner.find("tie_word_embeddings"); v && v->is_boolean())
      return {v->get<bool>(), "text_config.tie_word_embeddings"};
  }
  return {std::nullopt, "tie_word_embeddings"};
}

std::string architectures(const Json& config) {
  const Json* a = JsonMembers(config, "config.json").find("architectures");
  std::string out;
  if (a && a->is_array())
    for (const auto& name : *a)
      if (name.is_string()) out += (out.empty() ? "" : ", ") + name.get<std::string>();
  return out.empty() ? "none named" : out;
}

bool is_tensor_entry(const pickle::ValuePtr& v) { return v && tensor_ref_index(*v).has_value(); }

}  // namespace

const std::vector<TiedPair>& known_tied_pairs() {
  // transformers' `_tied_weights_keys` {head: embedding} of its decoder
  // language models, the most common first.
  static const std::vector<TiedPair> pairs = {
      {"lm_head.weight", "model.embed_tokens.weight"},  // Llama, Mistral, Qwen2/3, Gemma, Phi-3, OLMo, ...
      {"lm_head.weight", "model.language_model.embed_tokens.weight"},  // vision-language models built on those
      {"lm_head.weight", "transformer.wte.weight"},                    // GPT-2, GPT-Neo, GPT-J, CodeGen, GPT-BigCode
      {"lm_head.weight", "model.decoder.embed_tokens.weight"},         // OPT
      {"lm_head.weight", "model.text_model.embed_tokens.weight"},
      {"lm_head.weight", "transformer.word_embeddings.weight"},  // Bloom, Falcon
      {"lm_head.weight", "gpt_neox.embed_in.weight"},            // GPT-NeoX, Pythia
      {"lm_head.weight", "backbone.embeddings.weight"},          // Mamba
  };
  return pairs;
}

void add_tied_weights(CheckpointModel& model, const HfConfig& hf) {
  const std::string& path = hf.path;
  auto unknown = [&](const std::string& why) {
    log::warn(path + ": " + why + "; tied weights (tie_word_embeddings) are unknown: the state dict holds the " +
              "stored tensors only, and a tied key model.state_dict() has (lm_head.weight) may be missing from " +
              "DCP and per-rank outputs");
  };
  if (!hf.unusable.empty()) return unknown(hf.unusable);
  if (!hf.json) return;  // no model config: nothing says a weight is tied
  const Json& config = *hf.json;
  TieSetting tie = tie_setting(config);
  if (tie.value.has_value() && !*tie.value) return;
  const bool explicitly = tie.value.has_value();  // else absent: the default says tied

  pickle::ValuePtr root = model.root ? mapping_of(model.root) : nullptr;
  std::vector<const TiedPair*> fits;  // embedding stored, head not
  bool stored_both = false;
  if (root && root->is(pickle::Kind::kDict))
    for (const TiedPair& p : known_tied_pairs()) {
      if (!is_tensor_entry(root->get(p.embedding))) continue;
      if (root->get(p.head))
        stored_both = true;
      else
        fits.push_back(&p);
    }
  if (fits.size() == 1) {
    const TiedPair& p = *fits.front();
    root->entries.emplace_back(pickle::Value::str(p.head), root->get(p.embedding));
    std::string& fact = model.facts["hf_tied_weights"];
    fact += (fact.empty() ? "" : ", ") + std::string(p.head) + " = " + p.embedding;
    log::info(path + ": " + tie.key + " " + (explicitly ? "true" : "absent (transformers' default: true)") + ": " +
              p.head + " is " + p.embedding + ", as model.state_dict() holds it (safetensors outputs store it once)");
    return;
  }
  if (stored_both || !explicitly) return;  // stored as it is, or no more than a default says so
  std::string pairs;
  for (const TiedPair* p : fits) pairs += (pairs.empty() ? "" : ", ") + std::string(p->head) + " <- " + p->embedding;
  log::warn(path + ": " + tie.key + " is true, but " +
            (fits.empty() ? "no tied pair ckptconv knows fits the stored tensors (architectures: " +
                                printable_text(architectures(config)) + ")"
                          : "several tied pairs fit the stored tensors (" + pairs + ")") +
            ": the state dict holds the stored tensors only, and a tied key model.state_dict() has may be missing " +
            "from DCP and per-rank outputs");
}

}  // namespace ckpt::safetensors
