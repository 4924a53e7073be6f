#include "formats/megatron_legacy/tp_layout.h"

#include <cctype>
#include <string_view>
#include <utility>
#include <vector>

namespace ckpt::megatron_legacy {
namespace {

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// "mlp.linear_fc1.weight" -> {"linear_fc1", "weight"}.
std::pair<std::string_view, std::string_view> module_and_param(std::string_view name) {
  std::size_t last = name.rfind('.');
  if (last == std::string_view::npos) return {"", name};
  std::string_view head = name.substr(0, last);
  std::size_t before = head.rfind('.');
  return {before == std::string_view::npos ? head : head.substr(before + 1), name.substr(last + 1)};
}

}  // namespace

const char* tp_split_name(TpSplit split) {
  switch (split) {
    case TpSplit::kWhole: return "whole on every TP rank";
    case TpSplit::kDim0: return "split on dim 0";
    case TpSplit::kDim1: return "split on dim 1";
    case TpSplit::kGatedDim0: return "split on dim 0 as [gate; up] halves";
    case TpSplit::kExtraState: return "a module's _extra_state";
  }
  return "?";
}

std::optional<TpSplit> tp_split_of(const std::string& name, bool swiglu) {
  auto [module, param] = module_and_param(name);
  if (param == "_extra_state") return TpSplit::kExtraState;
  const bool weight_or_bias = param == "weight" || param == "bias";
  // Transformer Engine's fused layer norms live in the linear layer they feed.
  const bool fused_norm = param == "layer_norm_weight" || param == "layer_norm_bias";
  if (module == "word_embeddings" && param == "weight") return TpSplit::kDim0;  // VocabParallelEmbedding
  if (module == "position_embeddings" && param == "weight") return TpSplit::kWhole;
  if (module == "linear_qkv" || module == "output_layer") {  // ColumnParallelLinear
    if (weight_or_bias) return TpSplit::kDim0;
    if (fused_norm) return TpSplit::kWhole;
  }
  if (module == "linear_fc1") {  // ColumnParallelLinear, gated under SwiGLU
    if (weight_or_bias) return swiglu ? TpSplit::kGatedDim0 : TpSplit::kDim0;
    if (fused_norm) return TpSplit::kWhole;
  }
  if (module == "linear_proj" || module == "linear_fc2") {  // RowParallelLinear: the bias is added after the reduce
    if (param == "weight") return TpSplit::kDim1;
    if (param == "bias") return TpSplit::kWhole;
  }
  // input_layernorm, pre_mlp_layernorm, final_layernorm, q_layernorm, k_layernorm, ...
  if (ends_with(module, "layernorm") && weight_or_bias) return TpSplit::kWhole;
  return std::nullopt;
}

std::optional<RankFolderName> parse_rank_folder(const std::string& name) {
  constexpr std::string_view kPrefix = "mp_rank_";
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  std::string_view rest = std::string_view(name).substr(kPrefix.size());
  std::vector<int> numbers;
  while (true) {
    std::size_t us = rest.find('_');
    std::string_view part = rest.substr(0, us);
    if (!all_digits(part) || numbers.size() == 3) return std::nullopt;
    numbers.push_back(std::stoi(std::string(part)));
    if (us == std::string_view::npos) break;
    rest = rest.substr(us + 1);
  }
  RankFolderName out;
  out.tp = numbers[0];
  if (numbers.size() > 1) out.second = numbers[1];
  if (numbers.size() > 2) out.third = numbers[2];
  return out;
}

std::string rank_folder_name(int tp, int pp, int ep, int pp_size, int ep_size) {
  auto padded = [](int v, std::size_t width) {
    std::string s = std::to_string(v);
    return std::string(s.size() < width ? width - s.size() : 0, '0') + s;
  };
  std::string out = "mp_rank_" + padded(tp, 2);
  if (pp_size > 1) (out += '_') += padded(pp, 3);
  if (ep_size > 1) (out += '_') += padded(ep, 3);
  return out;
}

std::optional<LayerIndexAt> layer_index_in(const std::string& name) {
  for (std::size_t pos = 0; (pos = name.find("layers.", pos)) != std::string::npos; pos += 7) {
    if (pos != 0 && name[pos - 1] != '.') continue;
    std::size_t start = pos + 7, end = name.find('.', start);
    if (end == std::string::npos) return std::nullopt;
    std::string_view digits = std::string_view(name).substr(start, end - start);
    if (all_digits(digits)) return LayerIndexAt{start, end - start, std::stoll(std::string(digits))};
  }
  return std::nullopt;
}

namespace {

// {module's prefix, stored prefix}: the local spec's keys map.
constexpr std::pair<std::string_view, std::string_view> kLocalSpecKeys[] = {
    {"input_layernorm.", "self_attention.linear_qkv.layer_norm_"},
    {"pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_"},
};

}  // namespace

std::string stored_layer_name(const std::string& rest, bool local_spec) {
  if (!local_spec) return rest;
  for (const auto& [module, stored] : kLocalSpecKeys)
    if (rest.rfind(module, 0) == 0) return std::string(stored) + rest.substr(module.size());
  return rest;
}

std::string module_layer_name(const std::string& rest, bool local_spec) {
  if (!local_spec) return rest;
  for (const auto& [module, stored] : kLocalSpecKeys)
    if (rest.rfind(stored, 0) == 0) return std::string(module) + rest.substr(stored.size());
  return rest;
}

}  // namespace ckpt::megatron_legacy
