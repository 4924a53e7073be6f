// `ckptconv validate SRC`: checks a checkpoint without writing anything (but
// an optional manifest); exit 0 valid, 1 problems found, 3 unreadable or
// unsafe, 2 usage. The checks live in src/check/validate.h.
#include <iostream>

#include "check/validate.h"
#include "cli/commands.h"
#include "core/units.h"

namespace ckpt::cli {
namespace {

struct ValidateCliOptions {
  std::string source;
  check::ValidateOptions check;
  std::string device = "auto";
  std::string memory_limit = "256M";
  bool json = false;
};

int run_validate(ValidateCliOptions& opt) {
  opt.check.device = parse_device(opt.device);
  opt.check.memory_limit = parse_size(opt.memory_limit);
  if (opt.source.empty() && opt.check.files.empty()) fail_invalid("no checkpoint given: SRC or --files is required");
  if (opt.check.sha256 && opt.check.write_manifest.empty()) fail_invalid("--sha256 applies to --write-manifest");
  check::ValidateReport report = check::validate_checkpoint(opt.source, opt.check);
  if (opt.json)
    std::cout << check::report_to_json(report).dump(2) << "\n";
  else
    check::print_report(report, std::cout);
  return report.exit_code();
}

}  // namespace

void register_validate(CLI::App& app) {
  auto opt = std::make_shared<ValidateCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "validate",
      "Check a checkpoint without writing it: files, CRC-32 of every zip record, pickles, metadata, chunk coverage, ranks, "
      "optimizer state; optionally NaN/Inf, expected keys and world size, checksum manifests. "
      "Exit 0 valid, 1 problems found, 3 unreadable or unsafe, 2 usage");
  sub->add_option("SRC", opt->source,
                  "Checkpoint: a DCP directory, a .pt/.safetensors/.safetensors.index.json/.h5 file, or per-rank files "
                  "(a directory or a quoted glob)");
  sub->add_option("--files", opt->check.files, "Per-rank files listed one by one (instead of SRC)")->expected(1, -1);
  sub->add_option("--only", opt->check.only, "Per-rank families: check only the model or the optimizer files")
      ->check(CLI::IsMember({"model", "optim"}));
  sub->add_flag("--finite", opt->check.finite, "Scan every floating-point tensor for NaN and Inf (any is a problem)");
  sub->add_option("--expect-world-size", opt->check.expect_world_size,
                  "The world size the checkpoint must have been written at (single files count as 1)");
  sub->add_option("--expect-keys", opt->check.expect_keys_file,
                  "File with one key per line (dotted paths as inspect prints them; # comments): a missing or an "
                  "unexpected key is a problem");
  sub->add_option("--write-manifest", opt->check.write_manifest,
                  "Write a checksum of every file and tensor to this JSON file (only when the checkpoint is valid)");
  sub->add_option("--manifest", opt->check.manifest,
                  "Verify against a manifest written by --write-manifest; names every file or tensor changed, missing or new");
  sub->add_flag("--sha256", opt->check.sha256, "--write-manifest with SHA-256 instead of XXH3-64");
  sub->add_flag("--force", opt->check.force, "Overwrite an existing --write-manifest file");
  sub->add_option("--device", opt->device, "Backend for the finite scan")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--threads", opt->check.threads, "Threads for the finite scan (0: all cores)");
  sub->add_option("--memory-limit", opt->memory_limit, "Budget for reassembling a tensor's rows, e.g. 512M")
      ->capture_default_str();
  sub->add_flag("--json", opt->json, "Print the report as JSON (docs/json-schema.md)");
  add_runner(sub, [opt] { return run_validate(*opt); });
}

}  // namespace ckpt::cli
