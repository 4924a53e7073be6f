#include "jobs/reshard.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "core/progress.h"
#include "core/units.h"
#include "exec/write_dcp.h"
#include "exec/write_dcp_hf.h"
#include "exec/write_ds_universal.h"
#include "exec/write_folders.h"
#include "exec/write_fsdp1_flat.h"
#include "exec/write_megatron_legacy.h"
#include "exec/write_rank_files.h"
#include "formats/dcp/dcp_metadata.h"
#include "formats/detect.h"
#include "formats/megatron/megatron_reader.h"
#include "formats/megatron/megatron_writer.h"
#include "formats/megatron_legacy/legacy_reader.h"
#include "formats/megatron_legacy/legacy_writer.h"
#include "formats/rank_file_names.h"
#include "formats/source_traits.h"
#include "io/atomic_dir.h"
#include "io/storage.h"
#include "jobs/layout_writers.h"
#include "jobs/layouts.h"
#include "jobs/model_map.h"
#include "jobs/output_folder.h"
#include "model/describe.h"
#include "model/tree_walk.h"
#include "plan/reshard.h"
#include "plan/select.h"

namespace ckpt::jobs {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::ValuePtr;

// A full state dict (.pt, safetensors, HDF5) has no sharded layout of its own.
void require_layout_for_full_state_dict(const ReshardRequest& req, SourceKind kind) {
  if (!req.layout.empty() || source_traits(kind).sharded_layout) return;
  fail_invalid(req.common.source + ": a full state dict (" + source_kind_name(kind) +
               ") has no sharded layout of its own; choose one with --layout " + any_source_layouts());
}

ValuePtr top_level(const CheckpointModel& model, const std::string& key) {
  ValuePtr root = mapping_of(model.root);
  return root && root->is(Kind::kDict) ? root->get(key) : nullptr;
}

// model_rank0.pt (ShardedTensor values) or veRL's model_world_size_1_rank_0.pt (DTensor).
fsdp_ranks::RankFileName default_name(const std::string& kind, RankLayout values) {
  std::string file = values == RankLayout::kDTensor ? kind + "_world_size_1_rank_0.pt" : kind + "_rank0.pt";
  return *fsdp_ranks::parse_rank_file_name(file);
}

// The output families: the source's own names (per-rank sources, as the
// reader found them), else model_rank{r}.pt / optim_rank{r}.pt
// (ShardedTensor) or veRL's {model,optim}_world_size_{N}_rank_{r}.pt
// (DTensor). A root of exactly {"model", "optim"} (our consolidate output,
// DCP) gives both families.
std::vector<RankFamily> output_families(const CheckpointModel& model, RankLayout values) {
  ValuePtr m = top_level(model, "model"), o = top_level(model, "optim");
  bool pair = m && o;
  if (pair && mapping_of(model.root)->entries.size() > 2 && !source_traits(model.info.kind).per_rank_files) {
    std::string rest;
    for (const auto& [k, v] : mapping_of(model.root)->entries)
      if (!k->is(Kind::kStr) || (k->text != "model" && k->text != "optim")) rest += " " + path_component(*k);
    log::info("per-rank files hold a model and an optimizer state dict: not written:" + rest +
              " (consolidate or --layout dcp keep them)");
  }
  if (source_traits(model.info.kind).per_rank_files) {
    std::vector<fsdp_ranks::RankFileName> names;
    for (const auto& f : model.info.families)
      names.push_back(fsdp_ranks::name_rank_files(f.files).at(0).second);  // as the reader named them
    if (names.size() == 1) return {{names[0], model.root}};
    if (names.size() == 2 && pair) {
      if (names[0].kind == "optim") std::swap(names[0], names[1]);
      return {{names[0], m}, {names[1], o}};
    }
    fail(ErrorCode::kInternal, model.source + ": cannot match the per-rank families to the state dict read");
  }
  require_state_dict(model, "each per-rank file");
  if (pair) return {{default_name("model", values), m}, {default_name("optim", values), o}};
  bool optim = top_level(model, "state") && top_level(model, "param_groups");
  return {{default_name(optim ? "optim" : "model", values), model.root}};
}

std::size_t count_values(const pickle::Value& root) {
  std::size_t n = 0;
  walk_leaves(root, [&](const Leaf& leaf) { n += leaf.tensor ? 0 : 1; });
  return n;
}

// Tensor bytes the plan writes, for progress and the report.
uint64_t plan_output_bytes(const CheckpointModel& model, const ReshardPlan& plan) {
  uint64_t total = 0;
  for (const auto& items : plan.ranks)
    for (const auto& item : items)
      total = saturating_add(total, item.numel() * dtype_size(model.tensors[item.tensor].output_dtype()));
  return total;
}

// -v: the plan in one line.
void log_plan(const ReshardPlan& plan, uint64_t bytes, const std::string& output, std::string_view layout) {
  if (!log::verbose()) return;
  std::size_t items = 0;
  for (const auto& rank : plan.ranks) items += rank.size();
  log::debug("plan: " + std::to_string(items) + " tensor items over " + std::to_string(plan.ranks.size()) + " ranks, " +
             human_bytes(bytes) + " of tensor data -> " + output + " (" + std::string(layout) + ")");
}

// --part: this process's share (logged with where it came from), or nullopt.
std::optional<PartSpec> part_of(const ReshardRequest& req) {
  if (req.part.empty()) return std::nullopt;
  PartSpec part = parse_part(req.part);
  log::info("--part: " +
            (part.finalize_only ? std::string("finalize")
             : part.abort       ? std::string("abort")
                                : std::to_string(part.index) + "/" + std::to_string(part.count)) +
            " (" + part.from + ")");
  return part;
}

void report_part(JobReport& report, const PartOutcome& done) {
  report.summary = done.summary;
  report.tensors = done.tensors;  // this worker's share, for the success line
  report.bytes = done.bytes;
}

// --dry-run's files of a writer, name and exact size, under the output rank
// `rank_of(k)` says file k is written for.
std::vector<RankFilesOut> files_by_rank(PartedWriter& writer, int world_size,
                                        const std::function<std::size_t(std::size_t k)>& rank_of) {
  std::vector<std::string> names = writer.file_names();
  std::vector<uint64_t> sizes = output_sizes(writer);
  std::vector<RankFilesOut> files(static_cast<std::size_t>(world_size));
  for (std::size_t k = 0; k < names.size(); ++k) files.at(rank_of(k)).files.emplace_back(names[k], sizes[k]);
  return files;
}

std::size_t same_rank(std::size_t k) { return k; }  // DCP: file k is rank k's

// A Hugging Face folder (which holds no Megatron-LM args of its own).
bool is_hf_folder(SourceKind kind) {
  return kind == SourceKind::kHfFolder || kind == SourceKind::kHfBinFolder || kind == SourceKind::kSafetensorsIndex;
}

// --args-from: the Megatron-LM job whose args a legacy output from a Hugging
// Face folder carries, read whole (its args at the top); usage errors for
// another layout or source, exit 3 where it is no Megatron-LM checkpoint
// with args (megatron_lm_args).
std::optional<CheckpointModel> read_args_job(const ReshardRequest& req, SourceKind kind) {
  const bool legacy = req.layout == "megatron-legacy";
  if (req.args_from.empty()) {
    if (legacy && is_hf_folder(kind))
      fail_invalid(req.common.source +
                   ": --layout megatron-legacy from a Hugging Face folder needs --args-from CKPT, "
                   "a Megatron-LM checkpoint (legacy, or torch_dist with its common.pt) of the job that will load "
                   "it: a legacy rank file carries the job's args, which a Hugging Face folder has none of and "
                   "ckptconv does not make up (--layout megatron writes it as torch_dist, which needs none)");
    return std::nullopt;
  }
  if (!legacy)
    fail_invalid("--args-from: only for --layout megatron-legacy (not " +
                 (req.layout.empty() ? std::string("the source's own layout") : req.layout) + ")");
  if (!is_hf_folder(kind))
    fail_invalid(
        "--args-from: only for a Hugging Face folder source; " + req.common.source + " is a " + source_kind_name(kind) +
        (kind == SourceKind::kMegatron || kind == SourceKind::kMegatronLegacy ? ", whose own args the rank files carry"
                                                                              : ""));
  const SourceKind job_kind =
      with_context("--args-from " + req.args_from, [&] { return source_kind_of(req.args_from, ReadOptions{}); });
  if (job_kind != SourceKind::kMegatronLegacy && job_kind != SourceKind::kMegatron)
    fail_invalid("--args-from " + req.args_from + ": a " + source_kind_name(job_kind) +
                 ", not a Megatron-LM checkpoint (legacy root or iter_* folder, or torch_dist with common.pt)");
  // Read whole, as a source is (a legacy root at the iteration its tracker names).
  CheckpointModel job =
      with_context("--args-from " + req.args_from, [&] { return read_checkpoint(req.args_from, ReadOptions{}); });
  megatron_legacy::megatron_lm_args(job);  // exit 3 now, before the folder is read
  return job;
}

// The tail every layout shares once it has planned (report.bytes set):
// --dry-run runs `describe` and writes nothing; otherwise the output's size is
// checked, then `write` runs under one progress bar (tensor_copy counts every
// slab written).
void finish_layout(const LayoutJob& j, const std::function<void()>& describe, const std::function<void()>& write) {
  if (j.req.common.dry_run) {
    describe();
    return;
  }
  check_output_size(j.report.bytes, j.req.output, j.job);
  ProgressScope progress("reshard " + j.req.output, j.report.bytes);
  write();
}

// The same for a layout of one writer: this process's --part share, or the
// whole output.
void finish_layout(const LayoutJob& j, PartedWriter& writer, const std::function<void()>& describe) {
  finish_layout(j, describe, [&] {
    PartedOptions options = directory_output(j.req.output, j.req.common.force, !j.req.common.no_fsync, j.copy, j.model,
                                             request_json(j.req));
    if (auto part = part_of(j.req)) {
      report_part(j.report, write_parted(writer, options, *part));
      return;
    }
    write_whole(writer, options);
  });
}

// `model` as a DCP directory of `source_md`'s items for the new world
// size, `side_files` beside them.
void write_as_dcp(const LayoutJob& j, const CheckpointModel& model, const dcp::DcpMetadata& source_md,
                  const std::vector<SideFile>& side_files) {
  ReshardPlan plan = plan_reshard(model.tensors, *j.req.world_size, source_world_size(model));
  j.report.bytes = plan_output_bytes(model, plan);
  log_plan(plan, j.report.bytes, j.req.output, j.layout.name);
  DcpWriter writer(model, source_md, plan, j.req.output, side_files);
  finish_layout(j, writer, [&] {
    std::size_t bytes_items = 0;
    for (const auto& item : source_md.items) bytes_items += item.is_tensor ? 0 : 1;
    std::vector<RankFilesOut> files = files_by_rank(writer, plan.world_size, same_rank);
    describe_reshard(model, plan, bytes_items, false, files, {{".metadata", writer.metadata_size()}}, log::verbose(),
                     j.out);
    for (const SideFile& f : side_files) j.out << f.name << " (" << f.bytes.size() << " bytes)\n";
  });
}

// Accelerate's checkpoint folder (accelerator.save_state under FSDP's
// SHARDED_STATE_DICT): pytorch_model_fsdp_<i>/, a DCP directory of
// {"model": ...}, and optimizer_<i>/, one of {"optimizer": ...} (what
// accelerate's load_fsdp_model / load_fsdp_optimizer read), beside the
// files it saves whole (random_states_<rank>.pkl, scheduler.bin, ...).
struct AcceleratePart {
  std::string key;    // in the model read: "model", "optim", "model_1", ...
  std::string dir;    // pytorch_model_fsdp_0, optimizer_0, ...
  std::string inner;  // its DCP directory's one top-level key
};

std::vector<AcceleratePart> accelerate_parts(const CheckpointModel& model) {
  std::vector<AcceleratePart> out;
  for (const auto& [k, v] : mapping_of(model.root)->entries) {
    const std::string key = path_component(*k);
    const bool is_model = key.rfind("model", 0) == 0;
    if (!is_model && key.rfind("optim", 0) != 0) fail_invalid(key + ": not a part of an Accelerate checkpoint");
    const std::string index = key.find('_') == std::string::npos ? "0" : key.substr(key.find('_') + 1);
    out.push_back({key, (is_model ? "pytorch_model_fsdp_" : "optimizer_") + index, is_model ? "model" : "optimizer"});
  }
  return out;
}

// The part `p` of `model` alone, as its own DCP directory holds it.
CheckpointModel accelerate_part(const CheckpointModel& model, const AcceleratePart& p) {
  CheckpointModel part = model;
  part.info.flat_layout.reset();
  part.root = pickle::Value::dict({{pickle::Value::str(p.inner), mapping_of(model.root)->get(p.key)}});
  for (auto& t : part.tensors)
    if (t.name.rfind(p.key + ".", 0) == 0) t.name = p.inner + t.name.substr(p.key.size());
  prune_unreferenced(part.root, part.tensors);
  return part;
}

// ShardedTensor or DTensor values; a DTensor mesh like the source's (per-rank
// DTensor files, as the reader found it) unless --mesh-device /
// --mesh-dim-names say otherwise.
RankFilesLayout rank_files_layout(const ReshardRequest& req, const CheckpointModel& model, RankLayout values) {
  RankFilesLayout out;
  if (values != RankLayout::kDTensor) return out;
  out.values = RankLayout::kDTensor;
  if (source_traits(model.info.kind).per_rank_files && model.info.mesh) out.mesh = *model.info.mesh;
  if (!req.mesh_device.empty()) out.mesh.device_type = req.mesh_device;
  if (!req.mesh_dim_names.empty()) out.mesh.dim_names = req.mesh_dim_names;
  if (out.mesh.dim_names.size() > 1)
    fail_invalid("--mesh-dim-names: the output mesh has one dimension (got " +
                 std::to_string(out.mesh.dim_names.size()) + " names)");
  return out;
}

// A Megatron-LM job's torch_dist checkpoint read again as its --only optim
// view (the model and the optimizer's state per parameter name), or as
// its --only model view where it saved no optimizer or one whose layout
// is not read per parameter (dp_reshardable, fully_sharded_model_space):
// then only the model is written, and the run says so.
CheckpointModel torch_dist_views(const CheckpointModel& whole, const std::string& target) {
  const auto& common = whole.info.megatron->common_keys;
  if (std::find(common.begin(), common.end(), "optimizer") != common.end()) {
    try {
      return with_context("reading the optimizer to write it for " + target,
                          [&] { return megatron::read_torch_dist(whole.source, nullptr, "optim"); });
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnimplemented) throw;
      log::warn(whole.source + ": the optimizer is not written (its state is not read per parameter: " + e.what() +
                "); load the output with --no-load-optim");
    }
  }
  return megatron::read_torch_dist(whole.source, nullptr, "model");
}

}  // namespace

void write_dcp_layout(const LayoutJob& j) {
  const CheckpointModel& model = j.model;
  // A DCP source keeps its own items and planner_data; anything else (or a
  // DCP source cut down by --only) is flattened as dcp.save would.
  bool own_layout = model.info.flat_layout && j.req.common.only.empty();
  dcp::DcpMetadata source_md = own_layout ? dcp::metadata_of(*model.info.flat_layout) : flattened_layout(model);
  // A DCP source's own side files go with its own layout (Lightning's meta.pt).
  std::vector<SideFile> side_files;
  if (own_layout)
    for (const auto& f : model.info.files)
      if (fs::path(f).filename() == "meta.pt") side_files.push_back(read_side_file(f));
  write_as_dcp(j, model, source_md, side_files);
}

// Megatron-core torch_dist: the stored tensors and sharded objects as DCP
// items for the new world size, common.pt and metadata.json copied
// (formats/megatron/megatron_writer.h).
// A model mapped back from a Hugging Face folder has no torch_dist layout
// of its own: its layers are stacked as megatron-core saves them, and
// common.pt and metadata.json made.
void write_megatron_layout(const LayoutJob& j) {
  megatron::TorchDistOutput torch_dist =
      j.mapped_back ? megatron::torch_dist_from_model(j.model) : megatron::torch_dist_output(j.model);
  write_as_dcp(j, torch_dist.items, flattened_layout(torch_dist.items), torch_dist.side_files);
}

// Megatron-LM legacy rank files for a job at --tp x --pp
// (formats/megatron_legacy/legacy_writer.h).
void write_megatron_legacy_layout(const LayoutJob& j) {
  const int tp = j.req.tp.value_or(1), pp = j.req.pp.value_or(1), vpp = j.req.vpp.value_or(1);
  // The optimizer's state per parameter name, for each rank's `optimizer`:
  // the same checkpoint's --only optim view (refused, exit 3, where its
  // layout rules are not known: nothing is written then).
  std::optional<CheckpointModel> optim;
  std::optional<megatron_legacy::LegacySource> from_dist;
  const std::string target =
      "TP " + std::to_string(tp) + " x PP " + std::to_string(pp) + (vpp > 1 ? " x VPP " + std::to_string(vpp) : "");
  auto saved = j.model.facts.find("megatron optimizer");
  if (j.model.info.kind == SourceKind::kMegatronLegacy && saved != j.model.facts.end() && saved->second != "not saved")
    optim = with_context("reading the optimizer to write it for " + target,
                         [&] { return megatron_legacy::read_legacy(j.model.source, nullptr, "optim"); });
  if (j.model.info.kind == SourceKind::kMegatron && j.req.common.only.empty())
    from_dist =
        megatron_legacy::legacy_source_of_torch_dist(j.model, [&] { return torch_dist_views(j.model, target); });
  if (j.args_job) {
    // The rows a map padded are the config's vocabulary; a folder in
    // megatron's own names holds the job's padded rows as they were.
    std::optional<megatron_legacy::HfVocab> vocab;
    if (j.config_vocab) vocab = megatron_legacy::HfVocab{*j.config_vocab, "config.json's vocab_size"};
    from_dist = megatron_legacy::legacy_source_of_hf(j.model, *j.args_job, vocab);
  }
  const CheckpointModel& source = from_dist ? from_dist->model : j.model;
  const CheckpointModel* source_optim = from_dist ? (from_dist->optim ? &*from_dist->optim : nullptr)
                                        : optim   ? &*optim
                                                  : nullptr;
  megatron_legacy::LegacyOutput plan =
      megatron_legacy::plan_legacy_output(source, source_optim, tp, pp, j.req.distributed_optimizer, vpp);
  uint64_t bytes = 0;
  for (const auto& f : plan.files)
    for (const auto& t : f.tensors) bytes = saturating_add(bytes, t.output_nbytes());
  j.report.bytes = bytes;
  // Beside each rank file, distrib_optim.pt where the optimizer is the distributed one's.
  std::size_t distrib_optim = 0;
  for (const auto& f : plan.files) distrib_optim += file_name(f.name) == megatron_legacy::kDistribOptimFile;
  j.report.summary = "wrote " + j.req.output + " (" + std::string(j.layout.name) + "): " + target + ", " +
                     std::to_string(plan.files.size() - distrib_optim) + " rank files" +
                     (distrib_optim ? " with distrib_optim.pt" : "");
  log::debug("plan: " + std::to_string(plan.files.size()) + " rank files for TP " + std::to_string(tp) + " x PP " +
             std::to_string(pp) + ", " + human_bytes(static_cast<double>(bytes)) + " -> " + j.req.output);
  MegatronLegacyWriter writer(plan, j.req.output);
  finish_layout(j, writer, [&] {
    std::vector<uint64_t> sizes = output_sizes(writer);
    for (std::size_t k = 0; k < plan.files.size(); ++k)
      j.out << plan.files[k].name << ": " << plan.files[k].tensors.size() << " tensors, " << sizes[k] << " bytes\n";
    j.out << megatron_legacy::kTrackerFile << ": " << plan.tracker << "\n";
  });
}

// torch's DCP Hugging Face layout (HuggingFaceStorageWriter with
// save_distributed=True): a model's tensors only, one safetensors file per
// rank that holds a piece.
void write_hf_layout(const LayoutJob& j) {
  const CheckpointModel& model = j.model;
  ReshardPlan plan = plan_reshard(model.tensors, *j.req.world_size, source_world_size(model));
  std::vector<std::vector<dcp_hf::Piece>> pieces = dcp_hf_pieces(model, plan);
  j.report.bytes = plan_output_bytes(model, plan);
  log_plan(plan, j.report.bytes, j.req.output, j.layout.name);
  DcpHfWriter writer(model, plan, pieces, j.req.output);
  finish_layout(j, writer, [&] {
    // No file for a rank with no pieces.
    std::vector<RankFilesOut> files = files_by_rank(
        writer, plan.world_size, [&](std::size_t k) { return static_cast<std::size_t>(writer.rank_of(k)); });
    describe_reshard(model, plan, 0, false, files, {}, log::verbose(), j.out);
  });
}

// A DeepSpeed universal checkpoint: per parameter its full fp32 master and
// optimizer states, which an engine with load_universal partitions for any
// world size (so --world-size plays no part). DeepSpeed loads fp32 masters:
// --dtype is refused.
void write_universal_layout(const LayoutJob& j) {
  const ReshardRequest& req = j.req;
  if (j.job.cast_to || j.job.optim_cast_to)
    fail_invalid("--dtype, --optim-dtype: a universal checkpoint holds fp32 masters and states; drop them");
  // The tag folder's name goes into <root>/latest_universal, and DeepSpeed
  // reads <root>/<that name>: a folder named like a pointer file would take
  // the pointer's place.
  const std::string tag = fs::path(without_trailing_slashes(req.output)).filename().string();
  if (tag == "latest_universal" || tag == "latest")
    fail_invalid("-o " + req.output + ": a universal checkpoint's tag folder cannot be named '" + tag +
                 "', the name of DeepSpeed's pointer file beside it; name it <tag>_universal");
  if (req.world_size)
    log::info("--world-size " + std::to_string(*req.world_size) +
              ": not used, a universal checkpoint loads at the world size of the engine that loads it");
  if (req.expert_parallel && *req.expert_parallel < 1)
    fail_invalid("--expert-parallel must be at least 1 (got " + std::to_string(*req.expert_parallel) + ")");
  ds_universal::UniversalPlan plan =
      ds_universal::plan_universal(j.model, source_world_size(j.model), req.expert_parallel);
  j.report.bytes = plan.tensor_bytes;
  j.report.summary = "wrote " + req.output + " (" + std::string(j.layout.name) + "): " + std::to_string(plan.params) +
                     " parameters with optimizer state, " + std::to_string(plan.others) + " without";
  UniversalWriter writer(j.model, plan, req.output, req.update_latest);
  finish_layout(j, writer, [&] {
    for (const auto& f : plan.files) j.out << f.path << "  " << human_bytes(f.tensor_bytes()) << "\n";
    j.out << "latest_universal (beside " << req.output << ")\n";
  });
}

// FSDP1's fast save for another world size: LOCAL_STATE_DICT model files and
// raw optimizer files (formats/fsdp_flat/flat_writer.h), with the units,
// use_orig_params and tied names of the FSDP1 source they were read from.
void write_fsdp1_flat_layout(const LayoutJob& j) {
  const CheckpointModel& model = j.model;
  if (!model.info.fsdp1)
    fail_invalid("--layout " + std::string(j.layout.name) +
                 " writes the files of an FSDP1 job whose units and use_orig_params are known: "
                 "its source must be FSDP1 flat-parameter files read with --param-layout (" +
                 std::string(source_kind_name(model.info.kind)) + " " + model.source + " records no FSDP units)");
  if (j.job.cast_to || j.job.optim_cast_to)
    fail_invalid("--dtype, --optim-dtype: FSDP1 flat parameters keep the job's dtypes; drop them");
  // The source's names, as the reader found them (model_rank{r}.pt / optim_rank{r}.pt for a family it lacks).
  fsdp_ranks::RankFileName model_name = default_name("model", j.layout.values);
  fsdp_ranks::RankFileName optim_name = default_name("optim", j.layout.values);
  for (const RankFamily& f : output_families(model, j.layout.values))
    (f.name.kind == "optim" ? optim_name : model_name) = f.name;
  fsdp_flat::FlatPlan plan =
      fsdp_flat::plan_fsdp1_flat(model, *model.info.fsdp1, *j.req.world_size, model_name, optim_name);
  j.report.bytes = plan.tensor_bytes;
  FlatWriter writer(plan, j.req.output);
  finish_layout(j, writer, [&] {
    for (const auto& f : plan.files) j.out << f.path << "  " << human_bytes(f.tensor_bytes()) << "\n";
  });
}

// Several DCP directories in one folder with the files Accelerate saved
// whole, published as one (exec/write_folders.h), by one process (no --part).
void write_accelerate_layout(const LayoutJob& j) {
  const ReshardRequest& req = j.req;
  const CheckpointModel& model = j.model;
  if (source_traits(model.info.kind).reshard_layout != j.layout.name || !req.common.only.empty())
    fail_invalid(
        "--layout accelerate: the source must be an Accelerate checkpoint folder (pytorch_model_fsdp_0/, "
        "optimizer_0/), read whole (no --only)");
  std::vector<AcceleratePart> parts = accelerate_parts(model);
  std::vector<std::string> side_files;  // what Accelerate saved whole, copied unchanged
  for (const DirEntry& e : list_directory(model.source))
    if (e.is_file() && !e.link) side_files.push_back(e.path);
  // Each part planned first, so that its size is checked before anything is written.
  struct Planned {
    const AcceleratePart& part;
    CheckpointModel model;
    ReshardPlan plan;
    dcp::DcpMetadata layout;
  };
  std::vector<Planned> planned;  // the writers below refer to its elements: no reallocation after
  planned.reserve(parts.size());
  for (const AcceleratePart& p : parts) {
    CheckpointModel part = accelerate_part(model, p);
    ReshardPlan plan = plan_reshard(part.tensors, *req.world_size, source_world_size(model));
    dcp::DcpMetadata layout = flattened_layout(part);
    j.report.bytes = saturating_add(j.report.bytes, plan_output_bytes(part, plan));
    planned.push_back({p, std::move(part), std::move(plan), std::move(layout)});
  }
  auto describe = [&] {
    for (const Planned& p : planned) {
      j.out << p.part.dir << "/\n";
      DcpWriter writer(p.model, p.layout, p.plan, req.output + "/" + p.part.dir);
      std::vector<RankFilesOut> files = files_by_rank(writer, p.plan.world_size, same_rank);
      describe_reshard(p.model, p.plan, 0, false, files, {{".metadata", writer.metadata_size()}}, log::verbose(),
                       j.out);
    }
    for (const auto& f : side_files) j.out << fs::path(f).filename().string() << " (copied)\n";
  };
  std::vector<FoldersWriter::Folder> folders;
  for (const Planned& p : planned)
    folders.push_back(
        {p.part.dir, std::make_unique<DcpWriter>(p.model, p.layout, p.plan,
                                                 without_trailing_slashes(req.output) + "/" + p.part.dir)});
  FoldersWriter writer(req.output, std::move(folders), side_files);
  finish_layout(j, writer, describe);
}

void write_rank_files_layout(const LayoutJob& j) {
  const CheckpointModel& model = j.model;
  std::vector<RankFamily> families = output_families(model, j.layout.values);
  // Per-rank sources say which tensors were sharded; in a full state dict
  // every tensor with a dimension is (FSDP1 shards parameters and their
  // optimizer states, never the 0-dim `step`), except the buffers a reader
  // knows (FSDP1 keeps them whole on every rank).
  bool per_rank = source_traits(model.info.kind).per_rank_files;
  std::vector<bool> sharded;
  for (const auto& t : model.tensors)
    sharded.push_back(per_rank ? t.is_sharded() : !t.shape.empty() && t.storage != StorageKind::kBuffer);
  ReshardPlan plan = plan_rank_files(model.tensors, sharded, *j.req.world_size);
  RankFilesLayout rank_layout = rank_files_layout(j.req, model, j.layout.values);
  j.report.bytes = plan_output_bytes(model, plan);
  log_plan(plan, j.report.bytes, j.req.output, j.layout.name);
  RankFilesWriter writer(model, families, rank_layout, plan, j.req.output);
  finish_layout(j, writer, [&] {
    // One file per family and rank, rank by rank.
    std::vector<RankFilesOut> files =
        files_by_rank(writer, plan.world_size, [&](std::size_t k) { return k / families.size(); });
    describe_reshard(model, plan, count_values(*model.root), true, files, {}, log::verbose(), j.out);
  });
}

JobReport run_reshard(const ReshardRequest& req, std::ostream& out) {
  JobClock clock;
  const CommonOptions& opt = req.common;
  if (req.world_size && *req.world_size < 1)
    fail_invalid("--world-size must be at least 1 (got " + std::to_string(*req.world_size) + ")");
  if (!req.layout.empty() && !find_layout(req.layout)) {
    std::string names;
    for (const std::string& n : layout_choices()) names += (names.empty() ? "" : ", ") + n;
    fail_invalid("--layout " + req.layout + ": not a layout (" + names + ")");
  }
  const JobOptions job = settle(opt);
  if (opt.source.empty() == opt.files.empty()) fail_invalid("give SRC or --files (one of them)");
  const SourceKind kind = source_kind_of(opt.source, read_options(opt));
  require_layout_for_full_state_dict(req, kind);
  check_output_place(req.output, true);
  // The name itself, a dangling symlink included (lstat).
  if (!opt.dry_run && !opt.force && stat_path(req.output).exists())
    fail_invalid(req.output + ": output exists (use --force to overwrite)");
  // The layout named, else the source's own, decides whether --only's entry
  // stays under its key (LayoutInfo::bare).
  check_map_back_request(req.map, req.layout, opt.only, source_format_name(kind));
  const std::optional<CheckpointModel> args_job = read_args_job(req, kind);
  // A legacy output's vocabulary is padded as the job that loads it pads it.
  const int64_t pad_multiple =
      args_job ? megatron_legacy::vocab_multiple(megatron_legacy::megatron_lm_args(*args_job), req.tp.value_or(1))
               : req.padded_vocab_multiple;
  MappedBack back = apply_requested_map_back(read_selected(opt, /*keep_nesting=*/!reads_bare(req.layout, kind)),
                                             req.map, req.config_from, req.layout, opt.only, pad_multiple);
  const CheckpointModel& model = back.model;
  check_output_is_not_input(req.output, model);
  const LayoutInfo& layout = req.layout.empty() ? default_layout(model) : *find_layout(req.layout);
  if (layout.world_size == WorldSizeRule::kRequired && !req.world_size)
    fail_invalid("--world-size N is required (the number of ranks to write)");
  if (req.expert_parallel && &layout != find_layout("deepspeed-universal"))
    fail_invalid("--expert-parallel: only for --layout deepspeed-universal (not " + std::string(layout.name) + ")");
  if (layout.world_size == WorldSizeRule::kTpPp && req.world_size)
    fail_invalid("--world-size: --layout " + std::string(layout.name) + " writes one rank per --tp x --pp position");
  if (layout.world_size != WorldSizeRule::kTpPp && (req.tp || req.pp || req.vpp || req.distributed_optimizer))
    fail_invalid(std::string(req.distributed_optimizer ? "--distributed-optimizer" : "--tp / --pp / --vpp") +
                 ": only for a layout written per TP x PP position (not --layout " + std::string(layout.name) + ")");
  auto backend = choose_backend(job, job.cast_to || job.optim_cast_to);
  CopyOptions copy;
  copy.memory_limit = job.memory.copy();
  copy.backend = backend.get();
  copy.verify = record_verifier(opt);
  // An output rank's rows span parts of two source records: each part is
  // summed as it is copied, and a record is checked once its parts tile it
  // (the writers check what is left before publishing).
  if (copy.verify) copy.verify->defer_partial_records();
  JobReport report;
  report.summary = "wrote " + req.output + " (" + std::string(layout.name) +
                   "): " + std::to_string(req.world_size.value_or(0)) + " ranks";
  report.tensors = model.tensors.size();
  report.dry_run = opt.dry_run;
  // -o new/dir/ws4: its parents are made now (as consolidate's -o DIR/
  // makes them), and removed again if the job fails.
  CreatedDirectories parents = opt.dry_run ? CreatedDirectories() : CreatedDirectories::parents_of(req.output);
  layout.write({.layout = layout,
                .req = req,
                .job = job,
                .model = model,
                .copy = copy,
                .report = report,
                .out = out,
                .mapped_back = back.mapped,
                .args_job = args_job ? &*args_job : nullptr,
                .config_vocab = back.mapped ? back.config_vocab : std::nullopt});
  parents.keep();
  clock.finish(report);
  return report;
}

}  // namespace ckpt::jobs
