#include "jobs/common.h"

#include <algorithm>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "formats/detect.h"
#include "formats/source_traits.h"
#include "io/disk_space.h"
#include "io/s3_storage.h"
#include "io/s3_url.h"
#include "io/storage.h"
#include "model/validate.h"
#include "pickle/framework_objects.h"
#include "plan/select.h"

namespace ckpt::jobs {

void allow_globals(const CommonOptions& opt);

JobOptions settle(const CommonOptions& opt) {
  allow_globals(opt);
  JobOptions out;
  out.cast_to = parse_dtype_option(opt.dtype);
  out.optim_cast_to = parse_dtype_option(opt.optim_dtype);
  out.device = parse_device(opt.device);
  out.threads = opt.threads;
  const bool object_store = is_s3_url(opt.source) ||
                            std::any_of(opt.files.begin(), opt.files.end(), [](const auto& f) { return is_s3_url(f); });
  out.memory = MemoryBudget(parse_size(opt.memory_limit), object_store);
  // Never lowered: diff settles once per side, and a local side must not
  // take the read-ahead of the other side's objects.
  if (out.memory.read_ahead() > 0) set_s3_read_ahead_budget(out.memory.read_ahead());
  if (!opt.max_output_size.empty()) out.max_output = parse_size(opt.max_output_size);
  out.max_output_text = opt.max_output_size;
  return out;
}

// --allow-global: process-wide, as torch.serialization.add_safe_globals is
// (pickle/framework_objects.h), set before anything is read.
void allow_globals(const CommonOptions& opt) {
  for (const std::string& g : opt.allow_globals) pickle::allow_opaque_global(g);
}

ReadOptions read_options(const CommonOptions& opt) {
  allow_globals(opt);
  ReadOptions r{opt.files, opt.only, nullptr, opt.tag};
  r.param_layout = opt.param_layout;
  return r;
}

CheckpointModel read_source(const CommonOptions& opt) {
  settle(opt);  // a bad option value is a usage error before anything is read
  CheckpointModel model = read_checkpoint(opt.source, read_options(opt));
  if (spdlog::should_log(spdlog::level::debug)) {  // -v: what SRC was found to be
    std::string ws;
    for (int w : model.info.world_sizes) ws += (ws.empty() ? "" : ", ") + std::to_string(w);
    spdlog::debug("source {}: {} ({}), {} file(s), world size {}, {} tensors", model.source,
                  source_kind_name(model.info.kind), source_format_name(model.info.kind), model.info.files.size(),
                  ws.empty() ? "?" : ws, model.tensors.size());
    for (const auto& family : model.info.families)
      spdlog::debug("  family {}: {} x {}", family.kind.empty() ? "(unnamed)" : family.kind, family.files.size(),
                    family.name_template);
    for (const auto& [key, value] : model.facts) spdlog::debug("  {}: {}", key, value);
  }
  return model;
}

CheckpointModel read_selected(const CommonOptions& opt, bool keep_nesting) {
  return select_source(read_source(opt), opt, keep_nesting);
}

CheckpointModel select_source(CheckpointModel model, const CommonOptions& opt, bool keep_nesting) {
  const JobOptions job = settle(opt);
  const std::optional<DType> cast_to = job.cast_to;
  // Per-rank families keep model and optimizer in separate files: their
  // reader read only the family --only names.
  bool read_only = source_traits(model.info.kind).reader_selects_only;
  std::string only = read_only ? "" : opt.only;
  if (opt.exclude_frozen && !model.info.records_frozen)
    fail_invalid("--exclude-frozen: this " + std::string(source_format_name(model.info.kind)) +
                 " checkpoint does not record which parameters were frozen (DeepSpeed's ZeRO and fp16 "
                 "checkpoints do; an fp32 run without ZeRO does not); leave them out by name with --keys");
  if (!only.empty() || !opt.keys.empty() || cast_to || opt.exclude_frozen)
    model = select_entries(model, {only, opt.keys, cast_to, keep_nesting, opt.exclude_frozen});
  if (cast_to || job.optim_cast_to) {
    CastCounts n = apply_cast(model, cast_to, job.optim_cast_to);
    if (cast_to && !job.optim_cast_to && n.optim_kept > 0)
      log::info("--dtype " + opt.dtype + ": " + std::to_string(n.model_cast) + " model tensors cast; " +
                std::to_string(n.optim_kept) +
                " tensors of optimizer state keep their dtypes (--optim-dtype casts them)");
    if (n.packed_kept > 0)
      log::info("--dtype: " + std::to_string(n.packed_kept) +
                " float4_e2m1fn_x2 tensors keep their bytes (packed quantized values, meaningful only with their "
                "scales; not cast)");
  }
  require_valid(model);
  return model;
}

std::unique_ptr<Backend> choose_backend(const JobOptions& opt, bool arithmetic) {
  Device d = opt.device;
  if (!arithmetic && d != Device::kCuda)
    spdlog::debug("backend: cpu threads only: no cast or scan, bytes are copied unchanged (--device {} not needed)",
                  device_name(d));
  auto backend = make_backend(arithmetic || d == Device::kCuda ? d : Device::kCpu, opt.threads);
  if (arithmetic) spdlog::debug("backend: {} for casts and scans (--device {})", backend->name(), device_name(d));
  return backend;
}

std::shared_ptr<RecordVerifier> record_verifier(const CommonOptions& opt) {
  if (opt.no_verify) {
    spdlog::debug("--no-verify: source records are not checked against their CRC-32");
    return nullptr;
  }
  return std::make_shared<RecordVerifier>();
}

double JobClock::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void check_output_size(uint64_t bytes, const std::string& output, const JobOptions& opt) {
  if (opt.max_output && bytes > *opt.max_output)
    fail(ErrorCode::kResourceExhausted, output + ": the output would hold " + human_bytes(bytes) +
                                            " of tensor data, more than --max-output-size " + opt.max_output_text +
                                            "; nothing was written");
  if (auto free = free_bytes_at(output); free && bytes > *free)
    fail(ErrorCode::kResourceExhausted, output + ": the output needs " + human_bytes(bytes) +
                                            " of tensor data, the filesystem there has " + human_bytes(*free) +
                                            " free; nothing was written");
}

namespace {
namespace fs = std::filesystem;

// `inner` is `outer` or lies below it (both canonical).
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}
}  // namespace

void check_output_is_not_input(const std::string& output, const CheckpointModel& model) {
  namespace fs = std::filesystem;
  fs::path out = resolved_path(output);
  std::vector<std::string> inputs = model.info.files;
  inputs.push_back(model.source);
  for (const auto& input : inputs) {
    if (input.empty() || !stat_path(input).resolves()) continue;  // a glob or listed files: each is in `files`
    fs::path in = resolved_path(input);
    bool in_dir = is_directory(in.string());
    if (out == in || (in_dir && is_within(out, in)))
      fail_invalid(output + ": the output would be " + (out == in ? "" : "inside ") + "the input " + input +
                   "; write it elsewhere (--force does not change this)");
    if (is_within(in, out))
      fail_invalid(output + ": the output directory holds the input " + input +
                   ", which writing it would replace; write it elsewhere (--force does not change this)");
  }
}

void check_output_place(const std::string& output, bool directory) {
  namespace fs = std::filesystem;
  if (output.empty()) fail_invalid("no output given (-o OUT)");
  if (is_s3_url(output)) {
    // A bucket has no folders to make or to be in the way: the URL's form
    // is all there is to check (a missing bucket fails the first request).
    if (parse_s3_url(output).key.empty())
      fail_invalid(output + ": an output needs a key after the bucket (s3://BUCKET/KEY)");
    if (!directory && output.back() == '/')
      fail_invalid(output + ": names a folder (it ends in '/'); give the object to write, e.g. -o " + output +
                   "model.safetensors");
    return;
  }
  if (!directory && (output.back() == '/' || is_directory(output))) {
    std::string dir = output.back() == '/' ? output : output + "/";
    fail_invalid(output + (is_directory(output) ? ": is a directory" : ": names a directory (it ends in '/')") +
                 "; give the file to write, e.g. -o " + dir +
                 "model.safetensors (the extension picks the format: .pt, .safetensors, .h5)");
  }
  fs::path parent = fs::path(output.back() == '/' ? output.substr(0, output.size() - 1) : output).parent_path();
  // A missing parent is made by the job (CreatedDirectories::parents_of) once
  // nothing else refuses the output; a parent that is something else is not.
  for (fs::path p = parent; !p.empty(); p = p.parent_path()) {
    if (is_directory(p.string())) return;
    if (EntryStat st = stat_path(p.string()); st.exists())
      fail(ErrorCode::kOutputFailed,
           output + ": " + p.string() + (st.is_file() ? " is a file, not a directory" : " is not a directory"));
  }
}

void JobClock::finish(JobReport& report) const {
  report.seconds = seconds();
  if (report.dry_run) return;
  spdlog::info("{}: {} tensors, {} in {:.2f} s ({}/s)", report.summary, report.tensors, human_bytes(report.bytes),
               report.seconds,
               human_bytes(static_cast<uint64_t>(double(report.bytes) / std::max(report.seconds, 1e-3))));
}

}  // namespace ckpt::jobs
