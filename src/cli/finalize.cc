// `ckptconv finalize OUT`: the finalizing step of a --part output, when the
// worker that completed the set could not do it; the work is
// jobs::run_finalize.
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "jobs/finalize.h"

namespace ckpt::cli {

void register_finalize(CLI::App& app) {
  auto req = std::make_shared<jobs::FinalizeRequest>();
  CLI::App* sub = app.add_subcommand(
      "finalize", "Complete a --part output whose parts are all written (when the last worker could not finalize it)");
  sub->add_option("OUT", req->output, "The output the workers wrote (their -o)")->required()->group(kOutputGroup);
  sub->add_flag("--force", req->force, "Overwrite an existing output")->group(kOutputGroup);
  sub->add_flag("--no-fsync", req->no_fsync, "Do not fsync the output before publishing it")->group(kOutputGroup);
  set_footer(sub, {"ckptconv finalize full.pt", "ckptconv finalize ckpt-ws8"},
             "0 written; 2 usage error (parts of several plans beside OUT); 3 a part is missing, stale or corrupt\n"
             "(the message names the parts to rerun; nothing is written), or the source changed; 4 output not\n"
             "written; 5 internal error; 130/143/129 stopped by a signal (nothing written).",
             "The workers keep their request in OUT.parts-<plan>/request.json; finalize reruns its last step in the\n"
             "directory they ran in, reading the source's metadata again (not its tensor data).");
  add_runner(sub, [req] { return jobs::run_finalize(*req, std::cout).exit_code; });
}

}  // namespace ckpt::cli
