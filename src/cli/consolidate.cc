// `ckptconv consolidate SRC -o OUT.pt`: one full state dict from a sharded
// checkpoint, streamed tensor by tensor.
#include "cli/commands.h"
#include "cli/write_job.h"

namespace ckpt::cli {

void register_consolidate(CLI::App& app) {
  auto opt = std::make_shared<WriteJobOptions>();
  CLI::App* sub = app.add_subcommand("consolidate", "Merge a sharded checkpoint into one full state dict (.pt, .safetensors, .h5)");
  bind_write_job_options(sub, *opt);
  add_runner(sub, [opt] { return run_write_job(*opt); });
}

}  // namespace ckpt::cli
