#include "cli/write_job.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>

#include "core/error.h"
#include "core/units.h"
#include "exec/write_output.h"
#include "formats/detect.h"
#include "model/describe.h"
#include "model/validate.h"
#include "plan/select.h"

namespace ckpt::cli {

void bind_write_job_options(CLI::App* sub, WriteJobOptions& opt) {
  sub->add_option("SRC", opt.source, "Checkpoint: a DCP directory, a .pt file, or per-rank files (a directory or a quoted glob)");
  sub->add_option("--files", opt.files, "Per-rank files listed one by one (instead of SRC)")->expected(1, -1);
  sub->add_option("-o,--output", opt.output, "Output file (.pt)")->required();
  sub->add_option("--only", opt.only, "Keep only this top-level entry")->check(CLI::IsMember({"model", "optim"}));
  sub->add_option("--keys", opt.keys, "Keep only entries whose dotted path matches this regex (searched)");
  sub->add_option("--dtype", opt.dtype, "Cast floating-point tensors (optimizer step counters excepted)")
      ->check(CLI::IsMember({"keep", "fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--threads", opt.threads, "Threads for casts (0: LibTorch default)");
  sub->add_option("--memory-limit", opt.memory_limit, "Budget for reassembly buffers, e.g. 512M")->capture_default_str();
  sub->add_flag("--dry-run", opt.dry_run, "Print the plan (tensors, sources, output size); write nothing");
  sub->add_flag("--force", opt.force, "Overwrite an existing output");
}

int run_write_job(const WriteJobOptions& opt) {
  auto start = std::chrono::steady_clock::now();
  uint64_t memory_limit = parse_size(opt.memory_limit);
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
  // LibTorch is loaded only when a cast needs it.
  auto backend = cast_to ? make_cpu_backend(opt.threads) : nullptr;
  OutputOptions out;
  out.path = opt.output;
  out.force = opt.force;
  out.copy.memory_limit = memory_limit;
  out.copy.backend = backend.get();
  write_pt_output(model, out);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t bytes = 0;
  for (const auto& t : model.tensors) bytes += t.output_nbytes();
  spdlog::info("wrote {}: {} tensors, {} in {:.2f} s", opt.output, model.tensors.size(), human_bytes(bytes), secs);
  return 0;
}

}  // namespace ckpt::cli
