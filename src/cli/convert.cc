// `ckptconv convert SRC -o OUT`: rewrite a checkpoint through our reader and
// writer (tensors made contiguous, unused storage bytes dropped).
#include "cli/commands.h"
#include "cli/write_job.h"

namespace ckpt::cli {

void register_convert(CLI::App& app) {
  auto opt = std::make_shared<WriteJobOptions>();
  CLI::App* sub = app.add_subcommand("convert", "Rewrite a checkpoint in another file format (.pt, .safetensors, .h5)");
  bind_write_job_options(sub, *opt);
  add_runner(sub, [opt] { return run_write_job(*opt); });
}

}  // namespace ckpt::cli
