// `ckptconv consolidate SRC -o OUT` (a sharded checkpoint into one full state
// dict) and `ckptconv convert SRC -o OUT` (a full file into another format):
// one job, jobs::run_consolidate, under two names.
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "jobs/consolidate.h"
#include "jobs/model_map.h"
#include "jobs/source_kinds.h"

namespace ckpt::cli {
namespace {

constexpr const char* kWriteExitCodes =
    "0 written; 1 --finite found NaN/Inf (the output is still written); 2 usage error; 3 input unreadable,\n"
    "corrupt, unsupported or unsafe; 4 output not written, or a size or memory limit hit; 5 installation problem\n"
    "or internal error; 130/143/129 stopped by SIGINT/SIGTERM/SIGHUP (nothing written).";

CLI::App* register_write_command(CLI::App& app, const char* name, const char* description) {
  auto req = std::make_shared<jobs::ConsolidateRequest>();
  CLI::App* sub = app.add_subcommand(name, description);
  bind_common(sub, req->common, kSource | kFiles);
  // In the help's order: input, selection, conversion, output, performance.
  bind_common(sub, req->common, kOnly | kKeys | kExcludeFrozen | kDtype, {.only = "Keep only this top-level entry"});
  sub->add_flag(
         "--finite", req->finite,
         "Also count NaN/Inf in every tensor written; name each tensor that has any, exit 1 if any (the output is "
         "still written)")
      ->group(kConversionGroup);
  sub->add_option("-o,--output", req->output,
                  "Output file: .pt, .safetensors, .h5/.hdf5 (format by extension, else --format)")
      ->required()
      ->group(kOutputGroup);
  sub->add_option("--format", req->format, "Output format (default: by the output's extension, else pt)")
      ->check(CLI::IsMember(jobs::output_format_choices()))
      ->group(kOutputGroup);
  sub->add_option("--max-shard-size", req->max_shard_size,
                  "safetensors: split into <stem>-0000i-of-0000N.safetensors files of at most SIZE, with an index")
      ->group(kOutputGroup);
  sub->add_option("--config-from", req->config_from,
                  "-o DIR/: copy DIR2's config.json, generation_config.json and tokenizer files (every file of it "
                  "that holds no weights) into the output folder, config.json's dtype set to the dtype written")
      ->type_name("DIR2")
      ->group(kOutputGroup);
  sub->add_option("--map", req->map,
                  "--config-from: rename and re-lay the model's tensors as the config's architecture expects "
                  "(docs/maps.md): a built-in map (" +
                      jobs::builtin_map_names() +
                      "), a map file, or none (names kept); default: the built-in map for the source kind and the "
                      "config's architectures, with --only model (Mixtral and Qwen3-MoE experts in transformers 5's "
                      "fused tensors; the ...-per-expert maps write each expert under its own names)")
      ->type_name("NAME|FILE|none")
      ->group(kOutputGroup);
  sub->add_option("--compression", req->compression, "HDF5: compress datasets (shuffle + deflate)")
      ->check(CLI::IsMember({"none", "gzip"}))
      ->capture_default_str()
      ->group(kOutputGroup);
  bind_common(sub, req->common,
              kThreads | kDevice | kMemoryLimit | kDryRun | kForce | kNoFsync | kMaxOutputSize | kNoVerify,
              {.dry_run = "Print a summary of the plan (with -v, every chunk); write nothing"});
  sub->add_option(
         "--part", req->part,
         "Write worker I's share of OUT (I/N, 0-based; auto: from Slurm, Open MPI, PMI or torchrun); the "
         "worker completing the set finalizes OUT (finalize: only that step; abort: give the parts up). .pt and "
         ".safetensors, local or s3://")
      ->group(kPerformanceGroup);
  add_runner(sub, [req] { return jobs::run_consolidate(*req, std::cout).exit_code; });
  return sub;
}

}  // namespace

void register_consolidate(CLI::App& app) {
  CLI::App* sub = register_write_command(
      app, "consolidate", "Merge a sharded checkpoint into one full state dict (.pt, .safetensors, .h5)");
  set_footer(sub,
             {"ckptconv consolidate ckpt/step-1000 -o full.pt",
              "ckptconv consolidate ckpt/step-1000 --only model --dtype bf16 -o model.safetensors --max-shard-size 5G",
              "ckptconv consolidate 'ckpt/model_rank*.pt' --dry-run -o full.pt"},
             kWriteExitCodes, jobs::source_kinds_help());
}

void register_convert(CLI::App& app) {
  CLI::App* sub = register_write_command(
      app, "convert",
      "Rewrite a checkpoint in another file format (.pt, .safetensors, .h5): the same job as consolidate");
  set_footer(sub,
             {"ckptconv convert model.pt -o model.safetensors", "ckptconv convert model.safetensors -o model.h5",
              "ckptconv convert full.pt --dtype bf16 -o full-bf16.pt"},
             kWriteExitCodes,
             "convert and consolidate are one job under two names: any SRC, one full state dict written.\n\n" +
                 jobs::source_kinds_help());
}

}  // namespace ckpt::cli
