// `ckptconv reshard SRC -o DST --world-size N`: rewrite a DCP checkpoint for
// N ranks in the FSDP2 layout, offline, so training resumes at a new world
// size with its usual dcp.load.
#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>
#include <sys/stat.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/units.h"
#include "exec/write_dcp.h"
#include "formats/dcp/dcp_reader.h"
#include "formats/detect.h"
#include "model/describe.h"
#include "model/validate.h"
#include "plan/reshard.h"

namespace ckpt::cli {
namespace {

struct ReshardOptions {
  std::string source;
  std::string output;
  int world_size = 0;
  std::string memory_limit = "256M";
  bool dry_run = false;
  bool force = false;
};

int run_reshard(const ReshardOptions& opt) {
  auto start = std::chrono::steady_clock::now();
  if (opt.world_size < 1) fail_invalid("--world-size must be at least 1 (got " + std::to_string(opt.world_size) + ")");
  uint64_t memory_limit = parse_size(opt.memory_limit);
  SourceKind kind = detect_source(opt.source);
  if (kind != SourceKind::kDcpDir)
    fail(ErrorCode::kUnimplemented, opt.source + ": reshard reads DCP directories (with .metadata or __<rank>.metadata) only; " +
                                        source_kind_name(kind) + " sources are not supported yet");
  struct stat st {};
  if (!opt.dry_run && !opt.force && ::lstat(opt.output.c_str(), &st) == 0)
    fail_invalid(opt.output + ": output exists (use --force to overwrite)");
  CheckpointModel model = read_checkpoint(opt.source);
  dcp::DcpMetadata source_md = dcp::read_dcp_metadata(opt.source);
  require_valid(model);
  ReshardPlan plan = plan_reshard(model.tensors, opt.world_size, source_world_size(model));
  std::size_t bytes_items = 0;
  for (const auto& item : source_md.items) bytes_items += item.is_tensor ? 0 : 1;
  if (opt.dry_run) {
    DcpOutputSizes sizes = dcp_output_sizes(model, source_md, plan, opt.output);
    describe_reshard(model, plan, bytes_items, sizes.files, sizes.metadata, std::cout);
    return 0;
  }
  DcpOutputOptions out;
  out.dir = opt.output;
  out.force = opt.force;
  out.copy.memory_limit = memory_limit;
  write_dcp_reshard(model, source_md, plan, out);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t bytes = 0;
  for (const auto& t : model.tensors) bytes += t.nbytes();
  spdlog::info("wrote {}: {} ranks, {} tensors, {} in {:.2f} s", opt.output, opt.world_size, model.tensors.size(),
               human_bytes(bytes), secs);
  return 0;
}

}  // namespace

void register_reshard(CLI::App& app) {
  auto opt = std::make_shared<ReshardOptions>();
  CLI::App* sub = app.add_subcommand("reshard", "Rewrite a DCP checkpoint for another world size (FSDP2 layout, DCP directory)");
  sub->add_option("SRC", opt->source, "DCP directory")->required();
  sub->add_option("-o,--output", opt->output, "Output DCP directory")->required();
  sub->add_option("--world-size", opt->world_size, "Number of ranks to write")->required();
  sub->add_option("--memory-limit", opt->memory_limit, "Budget for reassembly buffers, e.g. 512M")->capture_default_str();
  sub->add_flag("--dry-run", opt->dry_run, "Print which source chunks feed each output rank and the bytes per file; write nothing");
  sub->add_flag("--force", opt->force, "Replace an existing output directory");
  add_runner(sub, [opt] { return run_reshard(*opt); });
}

}  // namespace ckpt::cli
