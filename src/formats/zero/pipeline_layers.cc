#include "formats/zero/pipeline_layers.h"

#include <algorithm>
#include <charconv>
#include <string_view>

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

namespace {

std::string two_digits(int n) {
  std::string digits = std::to_string(n);
  if (digits.size() < 2) digits.insert(0, 2 - digits.size(), '0');
  return digits;
}

constexpr std::string_view kTied = "tied_modules.";

}  // namespace

std::string layer_file_name(int layer, int tp) {
  return "layer_" + two_digits(layer) + (tp >= 0 ? "-model_" + two_digits(tp) : "") + "-model_states.pt";
}

std::optional<std::string> tied_key_of(const std::string& name) {
  if (!name.starts_with(kTied)) return std::nullopt;
  std::size_t dot = name.find('.', kTied.size());
  if (dot == std::string::npos || dot == kTied.size()) return std::nullopt;
  return name.substr(kTied.size(), dot - kTied.size());
}

std::optional<std::string> tied_key_of_layer(const std::set<std::string>& file_keys, const std::set<std::string>& names,
                                             const std::string& path) {
  std::map<std::string, std::set<std::string>> entries;  // KEY -> its entries' k
  for (const std::string& n : names)
    if (std::optional<std::string> key = tied_key_of(n)) entries[*key].insert(n.substr(kTied.size() + key->size() + 1));
  std::optional<std::string> hit;
  for (const auto& [key, ks] : entries) {
    if (ks != file_keys) continue;
    if (hit)
      fail(ErrorCode::kUnimplemented, path + ": the layer file's entries fit tied modules '" + *hit + "' and '" + key +
                                          "' alike (TiedLayerSpec), and nothing in the files says which it is");
    hit = key;
  }
  return hit;
}

std::vector<std::vector<int>> stage_layers(const std::vector<std::vector<std::string>>& stage_params,
                                           const std::map<int, std::string>& layer_files, const std::string& dir,
                                           int tp) {
  std::vector<std::vector<int>> out(stage_params.size());
  std::map<int, std::size_t> owner;  // layer -> the stage whose param_shapes name it
  for (std::size_t s = 0; s < stage_params.size(); ++s)
    for (const std::string& name : stage_params[s]) {
      if (tied_key_of(name)) continue;  // a tied module's: its file is found by its entries
      std::optional<int> layer = pipeline_layer_of(name);
      if (!layer)
        fail(ErrorCode::kUnimplemented, dir + ": pipeline stage " + std::to_string(s) + " trains '" +
                                            name.substr(0, 200) +
                                            "', which is in no numbered layer and no tied module (tied_modules.KEY)");
      if (!layer_files.count(*layer))
        fail(ErrorCode::kNotFound, dir + ": the layer file " + layer_file_name(*layer, tp) + " of pipeline stage " +
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

void append_layer_entries(std::vector<ModuleEntry>& out, const std::string& prefix, const Decoded& file) {
  for (const auto& [k, v] : as_dict(*file.root).entries) {
    if (!k->is(pickle::Kind::kStr)) fail_data_loss(file.path + ": a state dict key that is not a string");
    out.push_back({prefix + k->text, &file, v.get()});
  }
}

std::set<std::string> layer_file_keys(const Decoded& file) {
  std::set<std::string> out;
  for (const auto& [k, v] : as_dict(*file.root).entries)
    if (k->is(pickle::Kind::kStr)) out.insert(k->text);
  return out;
}

}  // namespace ckpt::zero
