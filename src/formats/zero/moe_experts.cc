#include "formats/zero/moe_experts.h"

#include <charconv>

namespace ckpt::zero {

namespace {
constexpr std::string_view kExperts = ".deepspeed_experts.";
constexpr std::string_view kMoe = "deepspeed_moe.";
}  // namespace

std::optional<ExpertName> parse_expert_name(const std::string& name) {
  std::size_t at = name.find(kExperts);
  if (at == std::string::npos) return std::nullopt;
  std::size_t begin = at + kExperts.size(), end = name.find('.', begin);
  if (end == std::string::npos || end == begin || end - begin > 6) return std::nullopt;
  ExpertName out;
  auto [ptr, ec] = std::from_chars(name.data() + begin, name.data() + end, out.id);
  if (ec != std::errc() || ptr != name.data() + end) return std::nullopt;
  out.prefix = name.substr(0, begin);
  out.rest = name.substr(end);
  return out;
}

std::vector<int> expert_data_parallel_ranks(int e, int ep, int world) {
  std::vector<int> out;
  for (int r = e; r < world; r += ep) out.push_back(r);
  return out;
}

std::string expert_file_name(int layer, int expert) {
  return "layer_" + std::to_string(layer) + "_expert_" + std::to_string(expert) + "_mp_rank_00_model_states.pt";
}

std::vector<ModuleEntry> with_experts(std::vector<ModuleEntry> module, const std::vector<ModuleEntry>& experts) {
  for (const ModuleEntry& e : experts) {
    std::size_t moe = e.name.find(kMoe);
    std::string layer = moe == std::string::npos ? std::string() : e.name.substr(0, moe + kMoe.size());
    std::size_t at = module.size();
    if (!layer.empty())
      for (std::size_t i = 0; i < module.size(); ++i)
        if (module[i].name.compare(0, layer.size(), layer) == 0) at = i + 1;
    module.insert(module.begin() + std::ptrdiff_t(at), e);
  }
  return module;
}

}  // namespace ckpt::zero
