// `ckptconv reshard SRC -o DST --world-size N [--layout ...]`: rewrite a
// checkpoint for N ranks, offline, so training resumes at a new world size
// with its usual loading code: a DCP directory in the FSDP2 layout, or N
// per-rank files as FSDP1 saves them under SHARDED_STATE_DICT (ShardedTensor
// or DTensor values). SRC is a DCP directory, per-rank files, or a full
// state dict (.pt, safetensors, HDF5: scatter without a process group).
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <sys/stat.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/units.h"
#include "exec/backend.h"
#include "exec/write_dcp.h"
#include "exec/write_rank_files.h"
#include "formats/dcp/dcp_reader.h"
#include "formats/dcp/dcp_writer.h"
#include "formats/detect.h"
#include "formats/fsdp_ranks/rank_file_names.h"
#include "model/describe.h"
#include "model/tree_walk.h"
#include "model/validate.h"
#include "plan/reshard.h"
#include "plan/select.h"

namespace ckpt::cli {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::ValuePtr;

struct ReshardOptions {
  std::string source;
  std::vector<std::string> files;  // --files: per-rank files listed one by one, instead of SRC
  std::string output;
  int world_size = 0;
  std::string layout;  // dcp | fsdp-sharded-tensor | fsdp-dtensor; empty: the source's own
  std::string only;    // model | optim: that family / top-level entry alone
  std::string dtype = "keep";
  std::string device = "auto";
  std::string mesh_device;                  // DTensor layout: the mesh's device type; empty: the source's, else cpu
  std::vector<std::string> mesh_dim_names;  // and its dimension name (veRL: fsdp); empty: the source's, else none
  int threads = 0;
  std::string memory_limit = "256M";
  bool dry_run = false;
  bool force = false;
};

bool is_sharded_value(const TensorEntry& t) { return t.stored_as == "ShardedTensor" || t.stored_as == "DTensor"; }

// A full state dict (.pt, safetensors, HDF5) has no sharded layout of its own.
void require_layout_for_full_state_dict(const ReshardOptions& opt, SourceKind kind) {
  if (!opt.layout.empty() || kind == SourceKind::kDcpDir || kind == SourceKind::kFsdpRanks) return;
  fail_invalid(opt.source + ": a full state dict (" + source_kind_name(kind) +
               ") has no sharded layout of its own; choose one with --layout dcp|fsdp-sharded-tensor|fsdp-dtensor");
}

// The layout written when --layout is not given: the source's own.
std::string default_layout(SourceKind kind, const CheckpointModel& model) {
  if (kind == SourceKind::kDcpDir) return "dcp";
  for (const auto& t : model.tensors)
    if (t.stored_as == "DTensor") return "fsdp-dtensor";
  return "fsdp-sharded-tensor";
}

// The source's per-rank state-dict files, as the reader found them (of
// kind `only` when given), with their parsed names.
std::vector<std::pair<std::string, fsdp_ranks::RankFileName>> source_rank_files(const ReshardOptions& opt) {
  std::vector<std::string> files = opt.files;
  std::error_code ec;
  if (files.empty())
    files = fs::is_directory(opt.source, ec) ? fsdp_ranks::list_rank_files(opt.source) : fsdp_ranks::expand_glob(opt.source);
  std::vector<std::pair<std::string, fsdp_ranks::RankFileName>> out;
  for (const auto& path : files) {
    auto name = fsdp_ranks::parse_rank_file_name(fs::path(path).filename().string());
    if (name && !name->auxiliary && (opt.only.empty() || name->kind == opt.only)) out.emplace_back(path, *name);
  }
  return out;
}

// The name templates of the source's per-rank families.
std::vector<fsdp_ranks::RankFileName> source_families(const ReshardOptions& opt) {
  std::vector<fsdp_ranks::RankFileName> out;
  for (const auto& [path, name] : source_rank_files(opt)) {
    bool seen = false;
    for (const auto& f : out) seen = seen || f.tmpl == name.tmpl;
    if (!seen) out.push_back(name);
  }
  return out;
}

ValuePtr top_level(const CheckpointModel& model, const std::string& key) {
  ValuePtr root = mapping_of(model.root);
  return root && root->is(Kind::kDict) ? root->get(key) : nullptr;
}

fsdp_ranks::RankFileName default_name(const std::string& kind, const std::string& layout) {
  std::string file = layout == "fsdp-dtensor" ? kind + "_world_size_1_rank_0.pt" : kind + "_rank0.pt";
  return *fsdp_ranks::parse_rank_file_name(file);
}

// The output families: the source's own names (per-rank sources), else
// model_rank{r}.pt / optim_rank{r}.pt (ShardedTensor) or veRL's
// {model,optim}_world_size_{N}_rank_{r}.pt (DTensor). A root of exactly
// {"model", "optim"} (our consolidate output, DCP) gives both families.
std::vector<RankFamily> output_families(const ReshardOptions& opt, SourceKind kind, const CheckpointModel& model,
                                        const std::string& layout) {
  ValuePtr m = top_level(model, "model"), o = top_level(model, "optim");
  bool pair = m && o && mapping_of(model.root)->entries.size() == 2;
  if (kind == SourceKind::kFsdpRanks) {
    auto names = source_families(opt);
    if (names.size() == 1) return {{names[0], model.root}};
    if (names.size() == 2 && pair) {
      if (names[0].kind == "optim") std::swap(names[0], names[1]);
      return {{names[0], m}, {names[1], o}};
    }
    fail(ErrorCode::kInternal, model.source + ": cannot match the per-rank families to the state dict read");
  }
  require_state_dict(model, "each per-rank file");
  if (pair) return {{default_name("model", layout), m}, {default_name("optim", layout), o}};
  bool optim = top_level(model, "state") && top_level(model, "param_groups");
  return {{default_name(optim ? "optim" : "model", layout), model.root}};
}

std::size_t count_values(const pickle::Value& root) {
  std::size_t n = 0;
  walk_leaves(root, [&](const Leaf& leaf) { n += leaf.tensor ? 0 : 1; });
  return n;
}

void log_done(const ReshardOptions& opt, const CheckpointModel& model, const std::string& layout,
              std::chrono::steady_clock::time_point start) {
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t bytes = 0;
  for (const auto& t : model.tensors) bytes += t.output_nbytes();
  spdlog::info("wrote {} ({}): {} ranks, {} tensors, {} in {:.2f} s", opt.output, layout, opt.world_size,
               model.tensors.size(), human_bytes(bytes), secs);
}

// Tensor bytes the plan writes, for progress.
uint64_t plan_output_bytes(const CheckpointModel& model, const ReshardPlan& plan) {
  uint64_t total = 0;
  for (const auto& items : plan.ranks)
    for (const auto& item : items) total += item.numel() * dtype_size(model.tensors[item.tensor].output_dtype());
  return total;
}

int reshard_to_dcp(const ReshardOptions& opt, SourceKind kind, const CheckpointModel& model, const CopyOptions& copy,
                   std::chrono::steady_clock::time_point start) {
  // A DCP source keeps its own items and planner_data; anything else (or a
  // DCP source cut down by --only) is flattened as dcp.save would.
  dcp::DcpMetadata source_md = kind == SourceKind::kDcpDir && opt.only.empty() ? dcp::read_dcp_metadata(opt.source)
                                                                               : flattened_layout(model);
  ReshardPlan plan = plan_reshard(model.tensors, opt.world_size, source_world_size(model));
  if (opt.dry_run) {
    std::size_t bytes_items = 0;
    for (const auto& item : source_md.items) bytes_items += item.is_tensor ? 0 : 1;
    DcpOutputSizes sizes = dcp_output_sizes(model, source_md, plan, opt.output);
    std::vector<RankFilesOut> files(sizes.files.size());
    for (std::size_t r = 0; r < files.size(); ++r)
      files[r].files.emplace_back(dcp::DcpDirWriter::file_name(static_cast<int>(r)), sizes.files[r]);
    describe_reshard(model, plan, bytes_items, false, files, {{".metadata", sizes.metadata}}, std::cout);
    return 0;
  }
  {
    ProgressScope progress("reshard " + opt.output, plan_output_bytes(model, plan));  // tensor_copy counts every slab written
    write_dcp_reshard(model, source_md, plan, {opt.output, opt.force, copy});
  }
  log_done(opt, model, "dcp", start);
  return 0;
}

// ShardedTensor or DTensor values; a DTensor mesh like the source's (per-rank
// DTensor files) unless --mesh-device / --mesh-dim-names say otherwise.
RankFilesLayout rank_files_layout(const ReshardOptions& opt, SourceKind kind, const std::string& layout) {
  RankFilesLayout out;
  if (layout != "fsdp-dtensor") return out;
  out.values = RankLayout::kDTensor;
  if (kind == SourceKind::kFsdpRanks)
    for (const auto& [path, name] : source_rank_files(opt))
      if (auto mesh = torch_pt::find_device_mesh(open_mapped_source(path))) {
        out.mesh = *mesh;
        break;
      }
  if (!opt.mesh_device.empty()) out.mesh.device_type = opt.mesh_device;
  if (!opt.mesh_dim_names.empty()) out.mesh.dim_names = opt.mesh_dim_names;
  if (out.mesh.dim_names.size() > 1)
    fail_invalid("--mesh-dim-names: the output mesh has one dimension (got " + std::to_string(out.mesh.dim_names.size()) + " names)");
  return out;
}

int reshard_to_rank_files(const ReshardOptions& opt, SourceKind kind, const CheckpointModel& model, const std::string& layout,
                          const CopyOptions& copy, std::chrono::steady_clock::time_point start) {
  std::vector<RankFamily> families = output_families(opt, kind, model, layout);
  // Per-rank sources say which tensors were sharded; in a full state dict
  // every tensor with a dimension is (FSDP1 shards parameters and their
  // optimizer states, never the 0-dim `step`).
  std::vector<bool> sharded;
  for (const auto& t : model.tensors)
    sharded.push_back(kind == SourceKind::kFsdpRanks ? is_sharded_value(t) : !t.shape.empty());
  ReshardPlan plan = plan_rank_files(model.tensors, sharded, opt.world_size);
  RankFilesLayout rank_layout = rank_files_layout(opt, kind, layout);
  if (opt.dry_run) {
    describe_reshard(model, plan, count_values(*model.root), true, rank_files_sizes(model, families, rank_layout, plan), {},
                     std::cout);
    return 0;
  }
  {
    ProgressScope progress("reshard " + opt.output, plan_output_bytes(model, plan));  // tensor_copy counts every slab written
    write_rank_files(model, families, rank_layout, plan, {opt.output, opt.force, copy});
  }
  log_done(opt, model, layout, start);
  return 0;
}

int run_reshard(const ReshardOptions& opt) {
  auto start = std::chrono::steady_clock::now();
  if (opt.world_size < 1) fail_invalid("--world-size must be at least 1 (got " + std::to_string(opt.world_size) + ")");
  uint64_t memory_limit = parse_size(opt.memory_limit);
  Device device = parse_device(opt.device);
  auto cast_to = parse_dtype_option(opt.dtype);
  if (opt.source.empty() == opt.files.empty()) fail_invalid("give SRC or --files (one of them)");
  SourceKind kind = opt.files.empty() ? detect_source(opt.source) : SourceKind::kFsdpRanks;
  require_layout_for_full_state_dict(opt, kind);
  struct stat st {};
  if (!opt.dry_run && !opt.force && ::lstat(opt.output.c_str(), &st) == 0)
    fail_invalid(opt.output + ": output exists (use --force to overwrite)");
  CheckpointModel model = read_checkpoint(opt.source, {opt.files, opt.only});
  // Per-rank families apply --only by reading that kind of file alone; other
  // sources keep the top-level entry.
  if (!opt.only.empty() && kind != SourceKind::kFsdpRanks) model = select_entries(model, {opt.only, "", std::nullopt});
  if (cast_to) apply_cast(model, *cast_to);
  require_valid(model);
  std::string layout = opt.layout.empty() ? default_layout(kind, model) : opt.layout;
  // The backend does casts only; LibTorch is loaded when one is needed or a device is asked for.
  std::unique_ptr<Backend> backend = cast_to || device != Device::kAuto ? make_backend(device, opt.threads) : nullptr;
  CopyOptions copy;
  copy.memory_limit = memory_limit;
  copy.backend = backend.get();
  if (layout == "dcp") return reshard_to_dcp(opt, kind, model, copy, start);
  return reshard_to_rank_files(opt, kind, model, layout, copy, start);
}

}  // namespace

void register_reshard(CLI::App& app) {
  auto opt = std::make_shared<ReshardOptions>();
  CLI::App* sub = app.add_subcommand(
      "reshard", "Rewrite a checkpoint for another world size: a DCP directory (FSDP2 layout) or per-rank FSDP files");
  sub->add_option("SRC", opt->source,
                  "DCP directory, per-rank files (a directory or a quoted glob), or a full state dict (.pt, safetensors, HDF5)")
;
  sub->add_option("--files", opt->files, "Per-rank files listed one by one (instead of SRC)")->expected(1, -1);
  sub->add_option("-o,--output", opt->output, "Output directory")->required();
  sub->add_option("--world-size", opt->world_size, "Number of ranks to write")->required();
  sub->add_option("--layout", opt->layout,
                  "dcp (one __<r>_0.distcp per rank + .metadata), fsdp-sharded-tensor or fsdp-dtensor (one torch.save "
                  "file per rank and family, as FSDP1 SHARDED_STATE_DICT); default: the source's own, required for a full state dict")
      ->check(CLI::IsMember({"dcp", "fsdp-sharded-tensor", "fsdp-dtensor"}));
  sub->add_option("--only", opt->only,
                  "Per-rank files: reshard only this family (e.g. the model files beside a raw flat-parameter optimizer); "
                  "other sources: keep only this top-level entry")
      ->check(CLI::IsMember({"model", "optim"}));
  sub->add_option("--dtype", opt->dtype, "Cast floating-point tensors (optimizer step counters excepted)")
      ->check(CLI::IsMember({"keep", "fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--device", opt->device, "Where casts run: auto, cpu, cuda")->capture_default_str();
  sub->add_option("--threads", opt->threads, "Threads for casts (0: all)");
  sub->add_option("--mesh-device", opt->mesh_device,
                  "fsdp-dtensor: device type of the DeviceMesh the files name (cpu, cuda); default: the source's, else cpu");
  sub->add_option("--mesh-dim-names", opt->mesh_dim_names,
                  "fsdp-dtensor: name of the mesh dimension (veRL: fsdp); default: the source's, else none");
  sub->add_option("--memory-limit", opt->memory_limit, "Budget for reassembly buffers, e.g. 512M")->capture_default_str();
  sub->add_flag("--dry-run", opt->dry_run, "Print which source chunks feed each output rank and the bytes per file; write nothing");
  sub->add_flag("--force", opt->force, "Replace an existing output directory");
  add_runner(sub, [opt] { return run_reshard(*opt); });
}

}  // namespace ckpt::cli
