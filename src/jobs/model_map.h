// --map and --config-from: which architecture map (plan/arch_map.h,
// docs/maps.md) a consolidate job applies to the model it writes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "model/checkpoint_model.h"

namespace ckpt::jobs {

// `model` as the map chosen by `map_option` makes it, or unchanged:
// - "none": the source's names kept;
// - a built-in map's name, or a map file (a path);
// - "" (no --map): with --config-from and --only model, the built-in map
//   for the source's kind and the config's `architectures`, said in a note;
//   none for a source kind that has such maps is a warning (names kept).
//   A map that lists no architectures (torchtitan's: its source kind, DCP,
//   is every DCP checkpoint's) is applied only when --map names it.
// A map needs the config (`config_from`/config.json): its fields size every
// tensor. InvalidArgument for a map that is neither a name nor a file, a
// malformed one, one for another source kind, or a map without --config-from.
CheckpointModel apply_requested_map(CheckpointModel model, const std::string& map_option,
                                    const std::string& config_from, const std::string& only);

// The way back (reshard, docs/maps.md): `model`, a Hugging Face model, in
// the names and layouts of the framework `layout` writes, by the map
// chosen in reverse, and whether one was applied:
// - "none": no map;
// - a built-in map's name, or a map file: that map backwards; its
//   source_kinds must include what the layout writes (--layout megatron:
//   megatron-torch-dist; dcp: dcp);
// - "" (no --map): for --layout megatron from a source that is no torch_dist
//   checkpoint, the built-in map for megatron-torch-dist and the config's
//   `architectures` (of a mixture of experts, the fused or the per-expert
//   one, by the names the folder holds), said in a note; otherwise none.
// The config is `config_from`'s config.json, else the source folder's.
// Model only: --only optim is refused (InvalidArgument), a tensor the map
// has no place for (an optimizer's state) is Unimplemented naming it.
// `pad_multiple`: the vocabulary's padding (--padded-vocab-multiple).
// Whether reshard maps its source back (the rules above), and the refusals
// it can make before reading the source: a layout that is no framework's,
// --only optim (InvalidArgument).
bool maps_back(const std::string& map_option, const std::string& layout, const std::string& source_format);
void check_map_back_request(const std::string& map_option, const std::string& layout, const std::string& only,
                            const std::string& source_format);
struct MappedBack {
  CheckpointModel model;
  bool mapped = false;
  std::optional<int64_t> config_vocab;  // the config's vocab_size, where it has one
};
MappedBack apply_requested_map_back(CheckpointModel model, const std::string& map_option,
                                    const std::string& config_from, const std::string& layout, const std::string& only,
                                    int64_t pad_multiple);

// The names of the built-in maps, for --map's help.
std::string builtin_map_names();

}  // namespace ckpt::jobs
