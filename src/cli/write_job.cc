#include "cli/write_job.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>

#include "core/error.h"
#include "core/progress.h"
#include "core/units.h"
#include "exec/backend.h"
#include "exec/write_output.h"
#include "formats/detect.h"
#include "model/describe.h"
#include "model/validate.h"
#include "plan/select.h"

namespace ckpt::cli {

void bind_write_job_options(CLI::App* sub, WriteJobOptions& opt) {
  sub->add_option("SRC", opt.source, "Checkpoint: a DCP directory, a .pt/.safetensors/.h5 file, or per-rank files (a directory or a quoted glob)");
  sub->add_option("--files", opt.files, "Per-rank files listed one by one (instead of SRC)")->expected(1, -1);
  sub->add_option("-o,--output", opt.output, "Output file: .pt, .safetensors, .h5/.hdf5 (format by extension, else --format)")->required();
  sub->add_option("--format", opt.format, "Output format (default: by the output's extension, else pt)")
      ->check(CLI::IsMember({"pt", "safetensors", "hdf5"}));
  sub->add_option("--max-shard-size", opt.max_shard_size,
                  "safetensors: split into <stem>-0000i-of-0000N.safetensors files of at most SIZE, with an index");
  sub->add_option("--compression", opt.compression, "HDF5: compress datasets (shuffle + deflate)")
      ->check(CLI::IsMember({"none", "gzip"}))
      ->capture_default_str();
  sub->add_option("--only", opt.only, "Keep only this top-level entry")->check(CLI::IsMember({"model", "optim"}));
  sub->add_option("--keys", opt.keys, "Keep only entries whose dotted path matches this regex (searched)");
  sub->add_option("--dtype", opt.dtype, "Cast floating-point tensors (optimizer step counters excepted)")
      ->check(CLI::IsMember({"keep", "fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--threads", opt.threads, "Host threads for gathers, casts and scans (0: all)");
  sub->add_option("--device", opt.device,
                  "Where casts and scans run: cuda (error if none), cpu, or auto (CUDA when built in and a device is visible)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  sub->add_flag("--finite", opt.finite,
                "Also count NaN/Inf in every tensor written; name each tensor that has any, exit 1 if any (the output is "
                "still written)");
  sub->add_option("--memory-limit", opt.memory_limit, "Budget for reassembly buffers, e.g. 512M")->capture_default_str();
  sub->add_flag("--dry-run", opt.dry_run, "Print the plan (tensors, sources, output size); write nothing");
  sub->add_flag("--force", opt.force, "Overwrite an existing output");
  sub->add_flag("--no-fsync", opt.no_fsync,
                "Skip the fsync before the output is renamed into place (faster; the output is still whole or absent, "
                "but not guaranteed to survive a power loss)");
}

namespace {

OutputFormat resolve_output_format(const WriteJobOptions& opt) {
  auto format = opt.format.empty() ? output_format_from_path(opt.output).value_or(OutputFormat::kPt)
                                   : *output_format_from_name(opt.format);
  if (!opt.max_shard_size.empty() && format != OutputFormat::kSafetensors)
    fail_invalid("--max-shard-size applies to safetensors output only");
  if (opt.compression != "none" && format != OutputFormat::kHdf5) fail_invalid("--compression applies to HDF5 output only");
  return format;
}

}  // namespace

int run_write_job(const WriteJobOptions& opt) {
  auto start = std::chrono::steady_clock::now();
  uint64_t memory_limit = parse_size(opt.memory_limit);
  OutputFormat format = resolve_output_format(opt);
  auto cast_to = parse_dtype_option(opt.dtype);
  CheckpointModel model = read_checkpoint(opt.source, {opt.files, opt.only});
  // Per-rank families apply --only by reading that kind of file alone (its
  // state dict as it is); other sources keep the top-level key.
  std::string only = model.format == "fsdp-ranks" ? "" : opt.only;
  model = select_entries(model, {only, opt.keys, cast_to});
  if (cast_to) apply_cast(model, *cast_to);
  require_valid(model);
  if (opt.dry_run) {
    describe_plan(model, opt.output, std::cout);
    return 0;
  }
  // Only arithmetic (casts, scans) goes to a device: bytes that pass through
  // unchanged are copied file to file, and LibTorch is loaded only for a cast.
  bool arithmetic = cast_to || opt.finite;
  Device device = parse_device(opt.device);
  auto backend = make_backend(arithmetic || device == Device::kCuda ? device : Device::kCpu, opt.threads);
  if (arithmetic) spdlog::info("backend: {}", backend->name());
  OutputOptions out;
  out.path = opt.output;
  out.force = opt.force;
  out.durable = !opt.no_fsync;
  out.copy.memory_limit = memory_limit;
  out.copy.backend = backend.get();
  FiniteCounts nonfinite;
  uint64_t nonfinite_tensors = 0;
  if (opt.finite)
    out.copy.on_finite = [&](const TensorEntry& t, const FiniteCounts& c) {
      if (c.all_finite()) return;
      ++nonfinite_tensors;
      nonfinite += c;
      spdlog::warn("tensor '{}': {} NaN, {} Inf", t.name, c.nan, c.inf);
    };
  out.max_shard_size = opt.max_shard_size.empty() ? 0 : parse_size(opt.max_shard_size);
  out.gzip = opt.compression == "gzip";
  uint64_t bytes = 0;
  for (const auto& t : model.tensors) bytes += t.output_nbytes();
  {
    ProgressScope progress("write " + opt.output, bytes);  // tensor_copy counts every slab written
    write_output(model, format, out);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("wrote {}: {} tensors, {} in {:.2f} s", opt.output, model.tensors.size(), human_bytes(bytes), secs);
  if (opt.finite) {
    if (nonfinite_tensors == 0) {
      spdlog::info("--finite: every tensor written is finite");
      return 0;
    }
    spdlog::error("--finite: {} tensors hold {} NaN and {} Inf", nonfinite_tensors, nonfinite.nan, nonfinite.inf);
    return 1;
  }
  return 0;
}

}  // namespace ckpt::cli
