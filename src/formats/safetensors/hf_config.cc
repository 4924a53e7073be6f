#include "formats/safetensors/hf_config.h"

#include <filesystem>

#include "core/error.h"
#include "io/byte_source.h"
#include "io/storage.h"
#include "model/ordered_json.h"

namespace ckpt::safetensors {
namespace fs = std::filesystem;

// A config.json is a few KB; one far larger is no model's config.
constexpr uint64_t kMaxConfigSize = 16ull << 20;

HfConfig read_hf_config(const std::string& dir) {
  HfConfig out;
  out.path = (fs::path(dir) / "config.json").string();
  if (!is_regular_file(out.path)) return out;
  SourcePtr file = open_file_source(out.path);
  if (file->size() > kMaxConfigSize) {
    out.unusable = "larger than 16 MiB";
    return out;
  }
  nlohmann::ordered_json config;
  try {
    config = parse_checkpoint_json(file->read_string(0, static_cast<std::size_t>(file->size())), out.path);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kDataLoss) throw;
    fail_data_loss(out.path + ": not readable as JSON (" + e.message() +
                   "): the model's config, which says which weights the model is and whether they are tied; "
                   "repair or remove it");
  }
  if (!config.is_object())
    out.unusable = "not a JSON object";
  else
    out.json = std::move(config);
  return out;
}

std::optional<std::string> explicit_weights_file(const HfConfig& config, const std::string& dir) {
  if (!config.json) return std::nullopt;
  const auto* v = JsonMembers(*config.json, "config.json").find("transformers_weights");
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_string()) fail_data_loss(config.path + ": transformers_weights is not a file name");
  const std::string name = v->get<std::string>();
  if (!name.ends_with(".safetensors") && !name.ends_with(".safetensors.index.json"))
    fail_data_loss(config.path + ": transformers_weights names '" + printable_text(name) +
                   "', neither a .safetensors file nor a .safetensors.index.json (from_pretrained refuses it too)");
  // from_pretrained refuses a name that leads out of the folder; so does
  // ckptconv, before opening anything (a config is not trusted to name files).
  const fs::path p(name);
  bool inside = !name.empty() && !p.is_absolute() && name.find('\0') == std::string::npos;
  for (const auto& part : p) inside = inside && part != ".." && part != ".";
  if (!inside)
    fail(ErrorCode::kUnsafe, config.path + ": transformers_weights names '" + printable_text(name) +
                                 "', which is not a file inside the model folder (from_pretrained refuses it too)");
  return (fs::path(dir) / p).string();
}

}  // namespace ckpt::safetensors
