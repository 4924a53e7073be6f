// `ckptconv validate SRC`: options; the work is jobs::run_validate (checks in
// check/validate.h). Exit 0 valid, 1 problems found, 3 unreadable or unsafe, 2 usage.
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "jobs/source_kinds.h"
#include "jobs/validate.h"

namespace ckpt::cli {

void register_validate(CLI::App& app) {
  auto req = std::make_shared<jobs::ValidateRequest>();
  CLI::App* sub =
      app.add_subcommand("validate",
                         "Check a checkpoint without writing it: files, CRC-32 of every zip record, pickles, metadata, "
                         "chunk coverage, ranks, "
                         "optimizer state; optionally NaN/Inf, expected keys and world size, checksum manifests. "
                         "Exit 0 valid, 1 problems found, 3 unreadable or unsafe, 2 usage");
  bind_common(sub, req->common, kSource | kFiles | kOnly | kDevice | kThreads | kMemoryLimit | kForce,
              {.only = "Per-rank families: check only the model or the optimizer files",
               .device = "Backend for the finite scan (auto: cpu, whose scan of bytes already in memory a GPU cannot "
                         "beat; cuda on request)",
               .threads = "Threads for the finite scan (0: all cores)",
               .memory_limit = "Budget for reassembling a tensor's rows, e.g. 512M",
               .force = "Overwrite an existing --write-manifest file"});
  const char* checks = "Checks";
  sub->add_flag("--finite", req->check.finite, "Scan every floating-point tensor for NaN and Inf (any is a problem)")
      ->group(checks);
  sub->add_option("--expect-world-size", req->check.expect_world_size,
                  "The world size the checkpoint must have been written at (single files count as 1)")
      ->group(checks);
  sub->add_option("--expect-keys", req->check.expect_keys_file,
                  "File with one key per line (dotted paths as inspect prints them; # comments): a missing or an "
                  "unexpected key is a problem")
      ->group(checks);
  sub->add_option("--write-manifest", req->check.write_manifest,
                  "Write a checksum of every file and tensor to this JSON file (only when the checkpoint is valid)")
      ->group(kOutputGroup);
  sub->add_option(
         "--manifest", req->check.manifest,
         "Verify against a manifest written by --write-manifest; names every file or tensor changed, missing or new")
      ->group(checks);
  sub->add_flag("--sha256", req->check.sha256, "--write-manifest with SHA-256 instead of XXH3-64")->group(kOutputGroup);
  sub->add_flag("--json", req->json, "Print the report as JSON (docs/json-schema.md)")->group(kOutputGroup);
  set_footer(sub,
             {"ckptconv validate ckpt/step-1000", "ckptconv validate ckpt/step-1000 --finite --expect-world-size 8",
              "ckptconv validate ckpt/step-1000 --write-manifest m.json   # later: --manifest m.json"},
             "0 valid; 1 problems found (each listed); 2 usage error; 3 input unreadable or unsafe; 4 the manifest\n"
             "could not be written; 5 installation problem or internal error.",
             jobs::source_kinds_help());
  add_runner(sub, [req] { return jobs::run_validate(*req, std::cout).exit_code; });
}

}  // namespace ckpt::cli
