// `ckptconv inspect SRC [--json]`: what a checkpoint holds, without loading
// tensor data.
#include <iostream>

#include "cli/commands.h"
#include "formats/detect.h"
#include "model/describe.h"

namespace ckpt::cli {
namespace {

struct InspectOptions {
  std::string source;
  std::vector<std::string> files;
  bool json = false;
};

int run_inspect(const InspectOptions& opt) {
  CheckpointModel model = read_checkpoint(opt.source, {opt.files, ""});
  if (opt.json)
    std::cout << model_to_json(model).dump(2) << "\n";
  else
    describe_model(model, std::cout);
  return 0;
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto opt = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand("inspect", "Show the tensors (dtype, global shape, chunks) and values of a checkpoint");
  sub->add_option("SRC", opt->source, "Checkpoint: a DCP directory, a .pt file, or per-rank files (a directory or a quoted glob)");
  sub->add_option("--files", opt->files, "Per-rank files listed one by one (instead of SRC)")->expected(1, -1);
  sub->add_flag("--json", opt->json, "Print JSON (schema in docs/inspect-json.md)");
  add_runner(sub, [opt] { return run_inspect(*opt); });
}

}  // namespace ckpt::cli
