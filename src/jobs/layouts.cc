#include "jobs/layouts.h"

#include <algorithm>

#include "core/error.h"
#include "formats/source_traits.h"
#include "jobs/layout_writers.h"

namespace ckpt::jobs {

const std::vector<LayoutInfo>& reshard_layouts() {
  static const std::vector<LayoutInfo> layouts = {
      {.name = "dcp", .help = "one __<r>_0.distcp per rank + .metadata", .any_source = true, .write = write_dcp_layout},
      {.name = "hf",
       .help = "torch's DCP Hugging Face layout: one shard-0000<r+1>-model-00001-of-00001.safetensors per rank, a "
               "model's tensors only",
       .bare = true,
       .any_source = true,
       .write = write_hf_layout},
      {.name = "fsdp-sharded-tensor",
       .help = "one torch.save file per rank and family, as FSDP1 SHARDED_STATE_DICT, with ShardedTensor values",
       .bare = true,
       .any_source = true,
       .values = RankLayout::kShardedTensor,
       .default_by_values = true,
       .write = write_rank_files_layout},
      {.name = "fsdp-dtensor",
       .help = "the same with DTensor values, files named as veRL names them",
       .bare = true,
       .any_source = true,
       .values = RankLayout::kDTensor,
       .default_by_values = true,
       .write = write_rank_files_layout},
      // Several DCP directories in one folder, written by one process.
      {.name = "accelerate",
       .help = "an Accelerate checkpoint folder: pytorch_model_fsdp_0/ and optimizer_0/ as DCP, its other files "
               "copied",
       .write = write_accelerate_layout},
      {.name = "deepspeed-universal",
       .help = "a DeepSpeed universal checkpoint, DST = <root>/<tag>_universal, which a DeepSpeed engine with "
               "load_universal loads at any world size; <root>/latest_universal names it, unless one exists: see "
               "--update-latest",
       .world_size = WorldSizeRule::kAny,
       .write = write_universal_layout},
      {.name = "fsdp1-flat",
       .help = "FSDP1's LOCAL_STATE_DICT model files and raw optimizer files per rank, from FSDP1 flat-parameter "
               "files read with --param-layout",
       .bare = true,
       .write = write_fsdp1_flat_layout},
      {.name = "megatron",
       .help = "a Megatron-core torch_dist checkpoint, from one read whole or from a Hugging Face folder through an "
               "architecture map (--map), which megatron-core loads at any TP x PP x DP",
       .write = write_megatron_layout},
      {.name = "megatron-legacy",
       .help =
           "a Megatron-LM ckpt_format=torch checkpoint for a job at --tp x --pp (tracker, iter_<N>/mp_rank_*/"
           "model_optim_rng.pt: the model, the job's args and each rank's optimizer, with distrib_optim.pt beside it "
           "for the distributed optimizer), from a legacy one or a Megatron-LM job's torch_dist one, read whole, or "
           "from a Hugging Face folder with --args-from",
       .world_size = WorldSizeRule::kTpPp,
       .write = write_megatron_legacy_layout},
  };
  return layouts;
}

const LayoutInfo* find_layout(std::string_view name) {
  for (const LayoutInfo& l : reshard_layouts())
    if (l.name == name) return &l;
  return nullptr;
}

namespace {

// The default_by_values entry for these values.
const LayoutInfo& layout_for_values(RankLayout values) {
  for (const LayoutInfo& l : reshard_layouts())
    if (l.default_by_values && l.values == values) return l;
  fail(ErrorCode::kInternal, std::string("no default layout for ") + rank_layout_name(values) + " values");
}

// The layout a source's format names as its own (SourceTraits::reshard_layout).
const LayoutInfo& own_layout(std::string_view name) {
  if (const LayoutInfo* l = find_layout(name)) return *l;
  fail(ErrorCode::kInternal, "a source format names an unknown reshard layout '" + std::string(name) + "'");
}

}  // namespace

const LayoutInfo& default_layout(const CheckpointModel& model) {
  if (std::string_view own = source_traits(model.info.kind).reshard_layout; !own.empty()) return own_layout(own);
  for (const auto& t : model.tensors)
    if (t.storage == StorageKind::kDTensor) return layout_for_values(RankLayout::kDTensor);
  return layout_for_values(RankLayout::kShardedTensor);
}

bool reads_bare(const std::string& requested, SourceKind kind) {
  if (!requested.empty()) {
    const LayoutInfo* l = find_layout(requested);
    return l && l->bare;
  }
  if (std::string_view own = source_traits(kind).reshard_layout; !own.empty()) return own_layout(own).bare;
  // Chosen by the values once read: bare when every candidate is.
  const auto& all = reshard_layouts();
  return std::all_of(all.begin(), all.end(), [](const LayoutInfo& l) { return !l.default_by_values || l.bare; });
}

std::vector<std::string> layout_choices() {
  std::vector<std::string> out;
  for (const LayoutInfo& l : reshard_layouts()) out.emplace_back(l.name);
  return out;
}

std::string layout_help() {
  std::string out;
  for (const LayoutInfo& l : reshard_layouts())
    out += (out.empty() ? "" : ", ") + std::string(l.name) + " (" + std::string(l.help) + ")";
  return out + "; default: the source's own, required for a full state dict";
}

std::string any_source_layouts() {
  std::string out;
  for (const LayoutInfo& l : reshard_layouts())
    if (l.any_source) (out += out.empty() ? "" : "|") += l.name;
  return out;
}

std::string reshard_description() {
  std::string names;
  for (const LayoutInfo& l : reshard_layouts()) names += (names.empty() ? "" : ", ") + std::string(l.name);
  return "Rewrite a checkpoint for another world size, in its own layout or another (--layout " + names + ")";
}

std::string world_size_help() {
  std::string any, tp_pp;
  for (const LayoutInfo& l : reshard_layouts()) {
    if (l.world_size == WorldSizeRule::kAny) any += (any.empty() ? "" : ", ") + std::string(l.name);
    if (l.world_size == WorldSizeRule::kTpPp) tp_pp += (tp_pp.empty() ? "" : ", ") + std::string(l.name);
  }
  std::string except;
  if (!any.empty()) except += ", except for " + any + ", which loads at any";
  if (!tp_pp.empty()) except += (except.empty() ? ", except for " : "; and ") + tp_pp + ", whose ranks are --tp x --pp";
  return "Number of ranks to write (required" + except + ")";
}

}  // namespace ckpt::jobs
