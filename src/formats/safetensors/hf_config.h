// config.json of a Hugging Face model folder: what ckptconv reads of it to
// find the model's weights as from_pretrained does (`transformers_weights`)
// and which of them are tied (hf_tied_weights.h).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ckpt::safetensors {

struct HfConfig {
  std::string path;                            // DIR/config.json
  std::optional<nlohmann::ordered_json> json;  // a JSON object; nullopt: no file, or `unusable` says why
  std::string unusable;                        // "larger than 16 MiB", "not a JSON object"; empty otherwise
};

// Reads `dir`'s config.json. A file that is not JSON is exit 3 naming it
// (from_pretrained refuses it too): a damaged folder, not a folder without
// settings, which reading on as one would make a different model silently.
HfConfig read_hf_config(const std::string& dir);

// config.json's `transformers_weights` (transformers >= 4.56: the weights
// file from_pretrained reads instead of model.safetensors or the index), as
// DIR/NAME; nullopt when the config names none. A name from_pretrained
// refuses (not *.safetensors or *.safetensors.index.json, or outside the
// folder) is exit 3 naming config.json.
std::optional<std::string> explicit_weights_file(const HfConfig& config, const std::string& dir);

}  // namespace ckpt::safetensors
