// `ckptconv consolidate SRC -o OUT` (a sharded checkpoint into one full state
// dict) and `ckptconv convert SRC -o OUT` (a full file into another format):
// one job, jobs::run_consolidate, under two names.
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "jobs/consolidate.h"

namespace ckpt::cli {
namespace {

void register_write_command(CLI::App& app, const char* name, const char* description) {
  auto req = std::make_shared<jobs::ConsolidateRequest>();
  CLI::App* sub = app.add_subcommand(name, description);
  bind_common(sub, req->common, kSource | kFiles);
  sub->add_option("-o,--output", req->output,
                  "Output file: .pt, .safetensors, .h5/.hdf5 (format by extension, else --format)")
      ->required();
  sub->add_option("--format", req->format, "Output format (default: by the output's extension, else pt)")
      ->check(CLI::IsMember({"pt", "safetensors", "hdf5"}));
  sub->add_option("--max-shard-size", req->max_shard_size,
                  "safetensors: split into <stem>-0000i-of-0000N.safetensors files of at most SIZE, with an index");
  sub->add_option("--compression", req->compression, "HDF5: compress datasets (shuffle + deflate)")
      ->check(CLI::IsMember({"none", "gzip"}))
      ->capture_default_str();
  bind_common(sub, req->common, kOnly | kKeys | kDtype | kThreads | kDevice,
              {.only = "Keep only this top-level entry"});
  sub->add_flag(
      "--finite", req->finite,
      "Also count NaN/Inf in every tensor written; name each tensor that has any, exit 1 if any (the output is "
      "still written)");
  bind_common(sub, req->common, kMemoryLimit | kDryRun | kForce | kNoFsync | kMaxOutputSize,
              {.dry_run = "Print the plan (tensors, sources, output size); write nothing"});
  add_runner(sub, [req] { return jobs::run_consolidate(*req, std::cout).exit_code; });
}

}  // namespace

void register_consolidate(CLI::App& app) {
  register_write_command(app, "consolidate",
                         "Merge a sharded checkpoint into one full state dict (.pt, .safetensors, .h5)");
}

void register_convert(CLI::App& app) {
  register_write_command(app, "convert", "Rewrite a checkpoint in another file format (.pt, .safetensors, .h5)");
}

}  // namespace ckpt::cli
