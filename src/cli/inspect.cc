// `ckptconv inspect SRC [--json]`: options; the work is jobs::run_inspect.
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "jobs/inspect.h"

namespace ckpt::cli {

void register_inspect(CLI::App& app) {
  auto req = std::make_shared<jobs::InspectRequest>();
  CLI::App* sub =
      app.add_subcommand("inspect", "Show the tensors (dtype, global shape, chunks) and values of a checkpoint");
  bind_common(sub, req->common, kSource | kFiles,
              {.source = "Checkpoint: a DCP directory, a .pt file, or per-rank files (a directory or a quoted glob)"});
  sub->add_flag("--json", req->json, "Print JSON (schema in docs/inspect-json.md)");
  add_runner(sub, [req] { return jobs::run_inspect(*req, std::cout).exit_code; });
}

}  // namespace ckpt::cli
