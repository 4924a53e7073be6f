#include "formats/zero/pipeline_layers.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"

namespace ckpt::zero {

std::optional<int> pipeline_layer_of(const std::string& name) {
  std::size_t dot = name.find('.');
  if (dot == 0 || dot == std::string::npos || dot > 6) return std::nullopt;
  int layer = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + dot, layer);
  if (ec != std::errc() || end != name.data() + dot) return std::nullopt;
  return layer;
}

std::string layer_file_name(int layer) {
  std::string digits = std::to_string(layer);
  if (digits.size() < 2) digits.insert(0, 2 - digits.size(), '0');
  return "layer_" + digits + "-model_states.pt";
}

std::vector<std::vector<int>> stage_layers(const std::vector<std::vector<std::string>>& stage_params,
                                           const std::map<int, std::string>& layer_files, const std::string& dir) {
  std::vector<std::vector<int>> out(stage_params.size());
  std::map<int, std::size_t> owner;  // layer -> the stage whose param_shapes name it
  for (std::size_t s = 0; s < stage_params.size(); ++s)
    for (const std::string& name : stage_params[s]) {
      std::optional<int> layer = pipeline_layer_of(name);
      if (!layer)
        fail(ErrorCode::kUnimplemented,
             dir + ": pipeline stage " + std::to_string(s) + " trains '" + name.substr(0, 200) +
                 "', which is in no numbered layer (tied layers, TiedLayerSpec, are not supported)");
      if (!layer_files.count(*layer))
        fail(ErrorCode::kNotFound, dir + ": the layer file " + layer_file_name(*layer) + " of pipeline stage " +
                                       std::to_string(s) + " is missing (its param_shapes name '" +
                                       name.substr(0, 200) + "')");
      auto [it, fresh] = owner.emplace(*layer, s);
      if (!fresh && it->second != s)
        fail_data_loss(dir + ": layer " + std::to_string(*layer) + " is trained by pipeline stages " +
                       std::to_string(it->second) + " and " + std::to_string(s));
    }
  for (const auto& [layer, path] : layer_files) {
    std::size_t stage = 0;
    if (auto it = owner.find(layer); it != owner.end()) {
      stage = it->second;
    } else if (auto below = owner.lower_bound(layer); below != owner.begin()) {
      stage = std::prev(below)->second;
    }
    out[stage].push_back(layer);
  }
  return out;
}

void append_layer_entries(std::vector<ModuleEntry>& out, int layer, const Decoded& file) {
  const std::string prefix = std::to_string(layer) + ".";
  for (const auto& [k, v] : as_dict(*file.root).entries) {
    if (!k->is(pickle::Kind::kStr)) fail_data_loss(file.path + ": a state dict key that is not a string");
    out.push_back({prefix + k->text, &file, v.get()});
  }
}

}  // namespace ckpt::zero
