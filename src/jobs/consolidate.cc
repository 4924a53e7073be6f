#include "jobs/consolidate.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <functional>
#include <set>

#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "core/progress.h"
#include "core/units.h"
#include "exec/parted_output.h"
#include "exec/write_output.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"
#include "io/storage.h"
#include "jobs/model_map.h"
#include "jobs/output_folder.h"
#include "model/describe.h"
#include "plan/select.h"

namespace ckpt::jobs {
namespace {

// Options only some formats take: --max-shard-size, --compression.
void check_format_options(const ConsolidateRequest& req, OutputFormat format) {
  const OutputFormatInfo& f = output_format_info(format);
  if (!req.max_shard_size.empty() && !f.shards)
    fail_invalid("--max-shard-size applies to safetensors output only, not " + std::string(f.name));
  if (req.compression != "none" && !f.compression)
    fail_invalid("--compression applies to HDF5 output only, not " + std::string(f.name));
}

// The format by --format, else by OUT's extension (case-insensitive). A typo
// (`.safetensor`) or an extension that names another format than --format is
// a usage error: writing a torch zip under a name that says otherwise would
// look right and load wrong.
OutputFormat resolve_output_format(const ConsolidateRequest& req) {
  const std::string kKnown = output_extensions_text();
  auto by_path = output_format_from_path(req.output);
  OutputFormat format;
  if (req.format.empty()) {
    if (!by_path)
      fail_invalid(req.output + ": the extension names no output format; use one of " + kKnown +
                   ", give --format pt|safetensors|hdf5, or end it in '/' for a folder (-o " +
                   without_trailing_slashes(req.output) + "/: model.safetensors and the source's config, as " +
                   "save_pretrained writes)");
    format = *by_path;
  } else {
    format = *output_format_from_name(req.format);
    if (by_path && *by_path != format)
      fail_invalid(req.output + ": the extension says " + output_format_name(*by_path) + " but --format is " +
                   output_format_name(format) + " (extensions: " + kKnown + ")");
  }
  check_format_options(req, format);
  return format;
}

// -o DIR/ (or an existing directory): the files Hugging Face tools,
// zero_to_fp32 and `accelerate merge-weights` write into an output folder.
// A model alone is model.safetensors (split at their 5 GB default, with
// model.safetensors.index.json), pytorch_model.bin or model.h5; anything more
// (optimizer state, training state) is full.safetensors, full.pt or full.h5,
// since a loader given model.* expects weights only.
bool is_output_directory(const std::string& output) {
  return !output.empty() && (output.back() == '/' || is_directory(output));
}

// The weights file's name in -o DIR/: model.* for a model's weights alone, full.* otherwise.
std::string file_in_directory(const ConsolidateRequest& req, OutputFormat format, const CheckpointModel& model) {
  bool weights = req.common.only == "model" || holds_weights_only(model);
  const OutputFormatInfo& f = output_format_info(format);
  return std::string(weights ? f.weights_file : f.full_file);
}

// What from_pretrained must be pointed at among the files written: the
// index of a sharded output, else the one file.
std::string weights_file_of(const std::vector<std::string>& files) {
  for (const auto& f : files)
    if (f.ends_with(".index.json")) return f;
  return files.empty() ? std::string() : files.front();
}

// The one dtype the floating-point tensors are written in; nullopt when
// they are written in several (a config then keeps what it says).
std::optional<DType> written_float_dtype(const CheckpointModel& model) {
  std::optional<DType> out;
  for (const auto& t : model.tensors) {
    const DType d = t.output_dtype();
    if (!dtype_info(d).is_floating) continue;
    if (out && *out != d) return std::nullopt;
    out = d;
  }
  return out;
}

// What goes beside the weights in -o DIR/: the source's side files, or
// --config-from's (whose config then says the dtype written), config.json
// edited to name `weights` (the file written, or its index).
struct FolderSideFiles {
  std::vector<std::string> files;
  ConfigEdits edits;
};
FolderSideFiles folder_side_files(const ConsolidateRequest& req, const CheckpointModel& model,
                                  std::optional<DType> cast_to, const std::string& weights) {
  FolderSideFiles out{model.info.side_files, {cast_to, std::filesystem::path(weights).filename().string()}};
  if (!req.config_from.empty()) {
    out.files = side_files_with_config_from(req.config_from, out.files);
    if (!out.edits.dtype) out.edits.dtype = written_float_dtype(model);
  }
  return out;
}

// -o s3://B/DIR/: the side files are put by the step that publishes the
// weights (the one process's, or the --part finalizer's before it removes
// the shared state), after the weights and their index; then the objects
// of the weights' family DIR held (`replaced`, --force) that the new
// weights did not put over are deleted (more shards than now, an index
// beside what is now one file). S3 has no rename to swap a folder with:
// until then a reader may list both families (from_pretrained reads
// model.safetensors, or the index that names the new shards).
std::function<void(const std::vector<std::string>&)> side_objects_step(const ConsolidateRequest& req,
                                                                       const CheckpointModel& model,
                                                                       std::optional<DType> cast_to,
                                                                       const std::string& directory,
                                                                       const std::vector<std::string>& replaced) {
  return [&req, &model, cast_to, directory, replaced](const std::vector<std::string>& published) {
    const FolderSideFiles side = folder_side_files(req, model, cast_to, weights_file_of(published));
    publish_side_objects(directory, side.files, side.edits, !replaced.empty());
    std::set<std::string> now;
    for (const auto& url : published) now.insert(file_name(url));
    for (const auto& name : replaced)
      if (!now.count(name) && !s3_delete_object(without_trailing_slashes(directory) + "/" + name))
        log::warn(without_trailing_slashes(directory) + "/" + name +
                  ": an object of the weights replaced, not deleted: delete it by hand");
  };
}

// --part into -o DIR/: the finalizer copies the side files into DIR, as
// the one process does (the folder is then the same), after the weights and
// before it removes the parts folder, as for s3:// (a finalize stopped in
// between is finished by the next: exec/part_protocol.cc).
std::function<void(const std::vector<std::string>&)> side_files_step(const ConsolidateRequest& req,
                                                                     const CheckpointModel& model,
                                                                     std::optional<DType> cast_to,
                                                                     const std::string& directory, bool durable) {
  return [&req, &model, cast_to, directory, durable](const std::vector<std::string>& published) {
    const FolderSideFiles side = folder_side_files(req, model, cast_to, weights_file_of(published));
    copy_folder_side_files(directory, without_trailing_slashes(directory), side.files, side.edits, durable);
  };
}

constexpr uint64_t kHuggingFaceShardSize = 5'000'000'000;  // save_pretrained's max_shard_size="5GB"

}  // namespace

std::vector<std::string> output_format_choices() {
  std::vector<std::string> out;
  for (const auto& f : output_formats()) {
    out.emplace_back(f.name);
    for (const auto& a : f.aliases) out.emplace_back(a);
  }
  return out;
}

JobReport run_consolidate(const ConsolidateRequest& request, std::ostream& out) {
  JobClock clock;
  ConsolidateRequest req = request;
  const CommonOptions& opt = req.common;
  const JobOptions job = settle(opt);
  std::string directory;  // -o DIR/: the folder the file goes into, created when missing
  if (is_output_directory(req.output)) {
    directory = req.output;
    if (req.format.empty()) req.format = "safetensors";
  } else {
    check_output_place(req.output, false);
  }
  if (!req.config_from.empty()) {
    if (directory.empty())
      fail_invalid("--config-from applies to a folder output: end -o with '/' (-o " +
                   without_trailing_slashes(req.output) + "/)");
    if (!is_directory(req.config_from)) fail_invalid("--config-from " + req.config_from + ": not a directory");
  }
  OutputFormat format = directory.empty() ? resolve_output_format(req) : *output_format_from_name(req.format);
  if (!directory.empty()) check_format_options(req, format);
  CheckpointModel model = apply_requested_map(read_selected(opt), req.map, req.config_from, opt.only);
  CreatedDirectories created;            // --part into -o DIR/: the parts' folder
  std::unique_ptr<OutputFolder> folder;  // -o DIR/: the folder, published whole
  std::vector<std::string> replaced;     // -o s3://B/DIR/: the weights' family there (--force)
  if (!directory.empty()) {
    std::string file = file_in_directory(req, format, model);
    req.output = without_trailing_slashes(directory) + "/" + file;
    if (output_format_info(format).shards && req.max_shard_size.empty())
      req.max_shard_size = std::to_string(kHuggingFaceShardSize);
    // A prefix with objects is added to, as a local folder is; the weights'
    // family there is replaced only with --force (OutputFolder's rules).
    if (is_s3_url(directory)) {
      replaced = file_family_in(directory, file);
      if (!replaced.empty() && !opt.force)
        fail_invalid(without_trailing_slashes(directory) + "/" + replaced.front() +
                     ": output exists (use --force to overwrite)");
    }
    if (!opt.dry_run && !req.part.empty() && !is_s3_url(directory)) created = CreatedDirectories(directory);
    if (!opt.dry_run && req.part.empty() && !is_s3_url(directory))
      folder = std::make_unique<OutputFolder>(directory, file, opt.force, !opt.no_fsync);
    spdlog::info("{} is a directory: writing {}", directory, req.output);
  }
  check_output_is_not_input(req.output, model);
  JobReport report;
  report.summary = "wrote " + req.output;
  report.tensors = model.tensors.size();
  for (const auto& t : model.tensors) report.bytes = saturating_add(report.bytes, t.output_nbytes());
  if (opt.dry_run) {
    describe_plan(model, req.output, log::verbose(), out);
    report.dry_run = true;
    return report;
  }
  if (spdlog::should_log(spdlog::level::debug)) {
    std::size_t chunks = 0, casts = 0;
    for (const auto& t : model.tensors) {
      chunks += t.chunks.size();
      casts += t.output_dtype() != t.dtype ? 1 : 0;
    }
    spdlog::debug("plan: {} tensors from {} chunks, {} cast, {} of tensor data -> {} ({})", report.tensors, chunks,
                  casts, human_bytes(report.bytes), req.output, output_format_name(format));
  }
  check_output_size(report.bytes, req.output, job);
  // libhdf5 writes a file by name: an s3:// HDF5 output is spooled locally
  // first (exec/write_output.cc), and needs its size free there.
  if (is_s3_url(req.output) && !output_format_info(format).parted)
    check_output_size(report.bytes, spool_directory(), job);
  // -o new/dir/x.pt: its folders are made now, and removed if the job fails.
  CreatedDirectories parents = folder ? CreatedDirectories() : CreatedDirectories::parents_of(req.output);
  auto backend = choose_backend(job, job.cast_to || job.optim_cast_to || req.finite);
  OutputOptions output;
  output.path = folder ? folder->file_path() : req.output;
  output.force = opt.force;
  output.durable = !opt.no_fsync;
  output.copy.memory_limit = job.memory.copy();
  output.copy.backend = backend.get();
  output.copy.verify = record_verifier(opt);
  FiniteCounts nonfinite;
  uint64_t nonfinite_tensors = 0;
  if (req.finite)
    output.copy.on_finite = [&](const TensorEntry& t, const FiniteCounts& c) {
      if (c.all_finite()) return;
      ++nonfinite_tensors;
      nonfinite += c;
      spdlog::warn("tensor '{}': {} NaN, {} Inf", t.name, c.nan, c.inf);
    };
  output.max_shard_size = req.max_shard_size.empty() ? 0 : parse_size(req.max_shard_size);
  output.gzip = req.compression == "gzip";
  if (is_s3_url(directory))
    output.publish_beside = side_objects_step(req, model, job.cast_to, directory, replaced);
  else if (!directory.empty() && !req.part.empty())
    output.publish_beside = side_files_step(req, model, job.cast_to, directory, output.durable);
  if (!req.part.empty()) {
    PartSpec part = parse_part(req.part);
    spdlog::info("--part: {} ({})",
                 part.finalize_only ? "finalize"
                 : part.abort       ? "abort"
                                    : std::to_string(part.index) + "/" + std::to_string(part.count),
                 part.from);
    PartOutcome done;
    {
      ProgressScope progress("write " + req.output, report.bytes);
      done = write_output_part(model, format, output, part, request_json(req, directory));
    }
    created.keep();
    parents.keep();
    report.summary = done.summary;
    report.tensors = done.tensors;  // this worker's share, for the success line
    report.bytes = done.bytes;
    clock.finish(report);
    return report;
  }
  std::vector<std::string> files;  // a sharded safetensors output is its shards and index
  {
    ProgressScope progress("write " + req.output, report.bytes);  // tensor_copy counts every slab written
    files = write_output(model, format, output);
  }
  parents.keep();
  if (folder) {
    const FolderSideFiles side = folder_side_files(req, model, job.cast_to, weights_file_of(files));
    folder->publish(side.files, side.edits);
    for (auto& f : files) f = folder->published_path(f);
  }
  if (files.size() > 1)
    report.summary = "wrote " + files.back() + " and " + std::to_string(files.size() - 1) + " shards (" +
                     files.front() + ", ...) (" + output_format_name(format) + ")";
  else
    report.summary = "wrote " + files.front() + " (" + output_format_name(format) + ")";
  clock.finish(report);
  if (req.finite) {
    if (nonfinite_tensors == 0) {
      spdlog::info("--finite: every tensor written is finite");
    } else {
      spdlog::error("--finite: {} tensors hold {} NaN and {} Inf", nonfinite_tensors, nonfinite.nan, nonfinite.inf);
      report.exit_code = 1;
    }
  }
  return report;
}

}  // namespace ckpt::jobs
