#include "jobs/model_map.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "exec/tensor_copy.h"
#include "formats/safetensors/hf_config.h"
#include "io/byte_sink.h"
#include "io/storage.h"
#include "model/ordered_json.h"
#include "plan/arch_map.h"
#include "plan/arch_map_inverse.h"

namespace ckpt::jobs {
namespace {

// A tensor the map left out because the target has no place for it is lost
// only when it holds something: read each (small: a bias per expert and
// layer) and warn, naming the first, when any is not all zero bytes.
void warn_nonzero_dropped(const CheckpointModel& model, const std::vector<DroppedTensor>& dropped,
                          const std::string& map_name, const std::vector<std::string>& architectures) {
  std::size_t nonzero = 0;
  std::string first, why;
  for (const DroppedTensor& d : dropped) {
    const TensorEntry& t = model.tensors.at(d.tensor);
    MemorySink bytes;
    append_tensor(t, bytes, CopyOptions{});
    const std::string& b = bytes.bytes();
    if (std::all_of(b.begin(), b.end(), [](char c) { return c == 0; })) continue;
    if (nonzero++ == 0) {
      first = t.name;
      why = d.why;
    }
  }
  if (nonzero == 0) return;
  std::string arch = architectures.empty() ? "the target" : architectures.front();
  log::warn("map " + map_name + ": " + std::to_string(nonzero) + " of " + std::to_string(dropped.size()) +
            " tensors it leaves out are not zero (first: " + first + "): " + why + ", and " + arch +
            " has no place for it: the exported model computes otherwise than the checkpoint's");
}

constexpr uint64_t kMaxMapBytes = 1 << 20;  // a map is a page of rules

// What a map reads of config.json: its integer and boolean fields (what map
// expressions use) and its `architectures`.
struct MapConfig {
  std::string path;
  ConfigFields fields;
  std::vector<std::string> architectures;
};

MapConfig read_config(const std::string& dir) {
  const safetensors::HfConfig hf = safetensors::read_hf_config(dir);
  if (!hf.json && hf.unusable.empty())
    fail_invalid("--config-from " + dir + ": no config.json there; an architecture map sizes every tensor by it");
  if (!hf.json) fail_data_loss(hf.path + ": " + hf.unusable);
  MapConfig c;
  c.path = hf.path;
  for (const auto& [k, v] : hf.json->items()) {
    if (v.is_number_integer())
      c.fields[k] = v.get<int64_t>();
    else if (v.is_boolean())
      c.fields[k] = v.get<bool>() ? 1 : 0;
    else if (k == "architectures" && v.is_array())
      for (const auto& a : v)
        if (a.is_string()) c.architectures.push_back(a.get<std::string>());
  }
  return c;
}

bool lists(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The map --map names: a built-in one, else a file.
ArchMap named_map(const std::string& option) {
  if (const ArchMap* m = find_builtin_arch_map(option)) return *m;
  if (!is_regular_file(option))
    fail_invalid("--map " + option + ": neither a built-in map (" + builtin_map_names() +
                 ") nor a map file; --map none keeps the source's names");
  return parse_arch_map(read_small_file(option, kMaxMapBytes), std::filesystem::path(option).stem().string(), option);
}

// The way back's built-in map for a folder of `arch` with no --map: the
// architecture's own (builtin_arch_map_for), unless the folder lacks its
// targets and holds those of a map that reads `arch` back besides
// (back_architectures: transformers 5 saves Mixtral's and Qwen3-MoE's
// experts one tensor each, where the export's default map fuses them).
// Where no map's targets are all there, the architecture's own map, whose
// refusal names the first tensor missing.
const ArchMap* map_back_for(const CheckpointModel& model, const std::string& target, const std::string& arch,
                            const MapConfig& config) {
  const ArchMap* own = builtin_arch_map_for(target, arch);
  if (own && holds_map_targets(model, *own, config.fields, config.path)) return own;
  for (const auto& m : builtin_arch_maps())
    if (lists(m.source_kinds, target) && lists(m.back_architectures, arch) &&
        holds_map_targets(model, m, config.fields, config.path))
      return &m;
  return own;
}

}  // namespace

std::string builtin_map_names() {
  std::string out;
  for (const auto& m : builtin_arch_maps()) out += (out.empty() ? "" : ", ") + m.name;
  return out;
}

CheckpointModel apply_requested_map(CheckpointModel model, const std::string& map_option,
                                    const std::string& config_from, const std::string& only) {
  if (map_option == "none") return model;
  const std::string kind = model.format();
  std::optional<ArchMap> map;
  std::optional<MapConfig> config;
  if (!map_option.empty()) {
    if (config_from.empty())
      fail_invalid("--map " + map_option +
                   ": needs --config-from DIR2 (the Hugging Face config whose fields size every tensor)");
    map = named_map(map_option);
    if (!map->source_kinds.empty() && !lists(map->source_kinds, kind))
      fail_invalid("--map " + map_option + ": a map for " + map->source_kinds.front() + " sources, and " +
                   model.source + " is " + kind);
    config = read_config(config_from);
  } else {
    // The export: a model's weights into a Hugging Face folder.
    if (config_from.empty() || only != "model") return model;
    config = read_config(config_from);
    for (const auto& arch : config->architectures)
      if (const ArchMap* m = builtin_arch_map_for(kind, arch)) {
        map = *m;
        log::info("map " + m->name + " (built in): " + kind + " names as " + arch + "'s, for " + config->path +
                  " (--map none keeps the source's names)");
        break;
      }
    if (!map) {
      bool kind_has_maps = false;
      for (const auto& m : builtin_arch_maps())  // those chosen by architecture (not torchtitan's: by name only)
        kind_has_maps |= lists(m.source_kinds, kind) && !m.architectures.empty();
      if (kind_has_maps) {
        std::string archs;
        for (const auto& a : config->architectures) archs += (archs.empty() ? "" : ", ") + a;
        log::warn("no built-in map from " + kind + " to " + (archs.empty() ? "(no architectures)" : archs) + " in " +
                  config->path + ": the source's names are kept (built in: " + builtin_map_names() +
                  "; --map FILE for another)");
      }
      return model;
    }
  }
  std::vector<DroppedTensor> dropped;
  CheckpointModel mapped = apply_arch_map(model, *map, config->fields, config->path, &dropped);
  warn_nonzero_dropped(model, dropped, map->name, config->architectures);
  return mapped;
}

bool maps_back(const std::string& map_option, const std::string& layout, const std::string& source_format) {
  if (map_option == "none") return false;
  // No --map: a Megatron source (torch_dist, or Megatron-LM legacy, which
  // --layout megatron restacks) keeps its names (and --layout megatron's refusals).
  if (map_option.empty())
    return (layout == "megatron" || layout == "megatron-legacy") && source_format != "megatron-torch-dist" &&
           source_format != "megatron-legacy";
  return true;
}

void check_map_back_request(const std::string& map_option, const std::string& layout, const std::string& only,
                            const std::string& source_format) {
  if (!maps_back(map_option, layout, source_format)) return;
  if (layout != "megatron" && layout != "megatron-legacy" && layout != "dcp")
    fail_invalid("--map " + map_option + ": the way back writes --layout megatron, megatron-legacy or dcp, not " +
                 (layout.empty() ? std::string("the source's own layout") : layout));
  if (only == "optim")
    fail_invalid(
        "--only optim: the way back through an architecture map writes a model only (a Hugging Face "
        "folder holds no optimizer state); --map none reshards the optimizer under its own names");
}

MappedBack apply_requested_map_back(CheckpointModel model, const std::string& map_option,
                                    const std::string& config_from, const std::string& layout, const std::string& only,
                                    int64_t pad_multiple) {
  if (!maps_back(map_option, layout, model.format())) return {std::move(model), false, std::nullopt};
  check_map_back_request(map_option, layout, only, model.format());
  // The source kind of the map read backwards: what the layout writes.
  // (megatron-legacy: megatron-core's names too, which the legacy writer
  // turns into the module's.)
  const std::string target = layout == "dcp" ? "dcp" : "megatron-torch-dist";
  std::string dir = config_from;
  if (dir.empty())
    dir = is_directory(model.source) ? model.source : std::filesystem::path(model.source).parent_path().string();
  // A folder already in megatron's names (a legacy model consolidated to
  // safetensors) has no config to map it by: written under its own names.
  if (layout == "megatron-legacy" && map_option.empty() && config_from.empty() &&
      !is_regular_file(path_join(dir, "config.json")))
    return {std::move(model), false, std::nullopt};
  if (map_option.empty() && config_from.empty() && !is_regular_file(path_join(dir, "config.json")))
    fail_invalid(
        "--layout megatron: the source must be a Megatron-core torch_dist checkpoint read whole, or a "
        "Hugging Face folder whose config.json selects a map back to megatron-core's names (docs/maps.md); " +
        model.source + " is " + model.format() + ", with no config.json");
  MapConfig config = read_config(dir);
  std::optional<ArchMap> map;
  if (!map_option.empty()) {
    map = named_map(map_option);
    if (!map->source_kinds.empty() && !lists(map->source_kinds, target))
      fail_invalid("--map " + map_option + ": a map for " + map->source_kinds.front() + " checkpoints; --layout " +
                   layout + " writes " + target);
  } else {
    for (const auto& arch : config.architectures)
      if (const ArchMap* m = map_back_for(model, target, arch, config)) {
        map = *m;
        log::info("map " + m->name + " (built in), the way back: " + arch + "'s names as " + target + "'s, for " +
                  config.path + " (--map none keeps the source's names)");
        break;
      }
    if (!map) {
      std::string archs;
      for (const auto& a : config.architectures) archs += (archs.empty() ? "" : ", ") + a;
      fail_invalid("--layout " + layout + ": " + model.source +
                   " is no Megatron checkpoint, and no built-in map leads from " +
                   (archs.empty() ? "(no architectures)" : archs) + " in " + config.path +
                   " to megatron-core's names (built in: " + builtin_map_names() + "; --map FILE for another)");
    }
  }
  CheckpointModel back = apply_arch_map_back(model, *map, config.fields, config.path, pad_multiple);
  auto vocab = config.fields.find("vocab_size");
  return {std::move(back), true, vocab == config.fields.end() ? std::nullopt : std::optional<int64_t>(vocab->second)};
}

}  // namespace ckpt::jobs
