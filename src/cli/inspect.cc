// `ckptconv inspect SRC [--json]`: options; the work is jobs::run_inspect.
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "jobs/inspect.h"
#include "jobs/source_kinds.h"

namespace ckpt::cli {

void register_inspect(CLI::App& app) {
  auto req = std::make_shared<jobs::InspectRequest>();
  CLI::App* sub =
      app.add_subcommand("inspect", "Show the tensors (dtype, global shape, chunks) and values of a checkpoint");
  bind_common(sub, req->common, kSource | kFiles);
  bind_common(sub, req->common, kOnly | kKeys);
  sub->add_flag("--json", req->json, "Print JSON (schema in docs/inspect-json.md)")->group(kOutputGroup);
  sub->add_flag("--tags", req->tags,
                "Print only the names --tag accepts for SRC (a folder of checkpoints or DeepSpeed tags), one per "
                "line")
      ->group(kOutputGroup);
  set_footer(sub,
             {"ckptconv inspect ckpt/step-1000", "ckptconv inspect 'ckpt/optim_rank*.pt'",
              "ckptconv inspect ckpt --tag latest --only model --keys 'layers\\.0\\.'"},
             "0 printed; 2 usage error; 3 input unreadable, corrupt, unsupported or unsafe; 5 installation problem or\n"
             "internal error.",
             jobs::source_kinds_help());
  add_runner(sub, [req] { return jobs::run_inspect(*req, std::cout).exit_code; });
}

}  // namespace ckpt::cli
