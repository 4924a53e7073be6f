// `ckptconv convert SRC -o OUT`: rewrite a checkpoint through our reader and
// writer (tensors made contiguous, unused storage bytes dropped).
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "core/units.h"
#include "exec/write_output.h"
#include "formats/detect.h"
#include "model/describe.h"

namespace ckpt::cli {
namespace {

struct ConvertOptions {
  std::string source;
  std::string output;
  bool force = false;
  std::string memory_limit = "256M";
};

int run_convert(const ConvertOptions& opt) {
  CheckpointModel model = read_checkpoint(opt.source);
  OutputOptions out;
  out.path = opt.output;
  out.force = opt.force;
  out.copy.memory_limit = parse_size(opt.memory_limit);
  write_pt_output(model, out);
  spdlog::info("wrote {} ({} tensors)", opt.output, model.tensors.size());
  return 0;
}

}  // namespace

void register_convert(CLI::App& app) {
  auto opt = std::make_shared<ConvertOptions>();
  CLI::App* sub = app.add_subcommand("convert", "Rewrite a checkpoint in another file format (same content)");
  sub->add_option("SRC", opt->source, "Checkpoint: a .pt file")->required();
  sub->add_option("-o,--output", opt->output, "Output file (.pt)")->required();
  sub->add_flag("--force", opt->force, "Overwrite an existing output");
  sub->add_option("--memory-limit", opt->memory_limit, "Buffer budget for reassembly, e.g. 512M")->capture_default_str();
  add_runner(sub, [opt] { return run_convert(*opt); });
}

}  // namespace ckpt::cli
