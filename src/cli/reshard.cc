// `ckptconv reshard SRC -o DST --world-size N [--layout ...]`: options and
// printing; the work is jobs::run_reshard.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "jobs/layouts.h"
#include "jobs/model_map.h"
#include "jobs/reshard.h"
#include "jobs/source_kinds.h"

namespace ckpt::cli {

void register_reshard(CLI::App& app) {
  auto req = std::make_shared<jobs::ReshardRequest>();
  CLI::App* sub = app.add_subcommand("reshard", jobs::reshard_description());
  CommonHelp help{
      .source =
          "Checkpoint of any kind listed below (a full state dict needs --layout); per-rank files: a directory "
          "or a quoted glob",
      .only =
          "Per-rank files: reshard only this family (e.g. the model files beside a raw flat-parameter optimizer); "
          "other sources: keep only this top-level entry",
      .device = "Where casts run: auto, cpu, cuda",
      .threads = "Threads for casts (0: all)",
      .dry_run = "Print a summary of the plan (with -v, which source chunks feed each output rank); write nothing",
      .force = "Replace an existing output directory"};
  bind_common(sub, req->common, kSource | kFiles, help);
  sub->add_option("-o,--output", req->output, "Output directory")->required()->group(kOutputGroup);
  auto world_size = std::make_shared<int>(0);  // CLI11 binds no std::optional: set when given, below
  CLI::Option* world_size_option =
      sub->add_option("--world-size", *world_size, jobs::world_size_help())->group(kOutputGroup);
  sub->add_option("--layout", req->layout, jobs::layout_help())
      ->check(CLI::IsMember(jobs::layout_choices()))
      ->group(kOutputGroup);
  auto tp = std::make_shared<int>(1), pp = std::make_shared<int>(1);
  CLI::Option* tp_option =
      sub->add_option("--tp", *tp, "megatron-legacy: tensor-parallel size of the job that loads it (default 1)")
          ->group(kOutputGroup);
  CLI::Option* pp_option =
      sub->add_option("--pp", *pp, "megatron-legacy: pipeline-parallel size of the job that loads it (default 1)")
          ->group(kOutputGroup);
  auto vpp = std::make_shared<int>(1);
  CLI::Option* vpp_option =
      sub->add_option("--vpp", *vpp,
                      "megatron-legacy: virtual pipeline stages per pipeline rank of the job that loads it (model0.."
                      "model<V-1> in each rank file, layers interleaved; default 1: none)")
          ->group(kOutputGroup);
  auto distributed_optimizer = std::make_shared<bool>(false);
  CLI::Option* distributed_optimizer_option =
      sub->add_flag("--distributed-optimizer,!--no-distributed-optimizer", *distributed_optimizer,
                    "megatron-legacy: write the optimizer for a job with --use-distributed-optimizer "
                    "(distrib_optim.pt beside each rank file), or (--no-...) as the plain optimizer's; default: as "
                    "the source saved it")
          ->group(kOutputGroup);
  sub->add_flag("--update-latest", req->update_latest,
                "deepspeed-universal: point an existing <root>/latest_universal at the new tag folder (without it "
                "an existing one is kept; a missing one is always written)")
      ->group(kOutputGroup);
  auto expert_parallel = std::make_shared<int>(0);
  CLI::Option* expert_parallel_option =
      sub->add_option("--expert-parallel", *expert_parallel,
                      "deepspeed-universal: the ep_size of the engine that will load a MoE checkpoint (DeepSpeed "
                      "names experts by their index on each expert-parallel rank); default: the source's own, "
                      "required when the source records none")
          ->group(kOutputGroup);
  bind_common(sub, req->common, kOnly | kDtype | kDevice | kThreads, help);
  sub->add_option(
         "--mesh-device", req->mesh_device,
         "fsdp-dtensor: device type of the DeviceMesh the files name (cpu, cuda); default: the source's, else cpu")
      ->group(kOutputGroup);
  sub->add_option("--mesh-dim-names", req->mesh_dim_names,
                  "fsdp-dtensor: name of the mesh dimension (veRL: fsdp); default: the source's, else none")
      ->group(kOutputGroup);
  sub->add_option("--map", req->map,
                  "--layout megatron|megatron-legacy|dcp from a Hugging Face folder: the architecture map read "
                  "backwards (docs/maps.md): a built-in map (" +
                      jobs::builtin_map_names() +
                      "), a map file, or none (names kept); default for --layout megatron: the built-in map for "
                      "the config's architectures")
      ->type_name("NAME|FILE|none")
      ->group(kOutputGroup);
  sub->add_option("--config-from", req->config_from,
                  "--map: the Hugging Face config whose fields size every tensor (default: the source folder's "
                  "config.json)")
      ->type_name("DIR2")
      ->group(kOutputGroup);
  sub->add_option("--padded-vocab-multiple", req->padded_vocab_multiple,
                  "--map: pad the vocabulary's rows with zeros to a multiple of M, Megatron-LM's "
                  "make_vocab_size_divisible_by x the TP size that loads it")
      ->type_name("M")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str()
      ->group(kOutputGroup);
  sub->add_option("--args-from", req->args_from,
                  "megatron-legacy from a Hugging Face folder: the Megatron-LM checkpoint (legacy root or iter_* "
                  "folder, or torch_dist with its common.pt) whose job args the rank files carry, checked against "
                  "the model")
      ->type_name("CKPT")
      ->group(kOutputGroup);
  bind_common(sub, req->common, kMemoryLimit | kDryRun | kForce | kNoFsync | kMaxOutputSize | kNoVerify, help);
  sub->add_option("--part", req->part,
                  "Write worker I's share of the output files (I/N, 0-based; auto: from Slurm, Open MPI, PMI or "
                  "torchrun); the worker completing the set finalizes DST (finalize: only that step; abort: give the "
                  "parts up)")
      ->group(kPerformanceGroup);
  set_footer(
      sub,
      {"ckptconv reshard ckpt/step-1000 -o ckpt-ws4 --world-size 4",
       "ckptconv reshard hf-model/ -o ckpt-ws8 --world-size 8 --layout dcp",
       "ckptconv reshard megatron-lm/ -o megatron-tp1pp2 --layout megatron-legacy --tp 1 --pp 2 --dry-run"},
      "0 written; 2 usage error; 3 input unreadable, corrupt, unsupported or unsafe; 4 output not written, or a\n"
      "size or memory limit hit; 5 installation problem or internal error; 130/143/129 stopped by\n"
      "SIGINT/SIGTERM/SIGHUP (nothing written).",
      jobs::source_kinds_help());
  add_runner(sub, [req, world_size, world_size_option, expert_parallel, expert_parallel_option, tp, tp_option, pp,
                   pp_option, vpp, vpp_option, distributed_optimizer, distributed_optimizer_option] {
    if (world_size_option->count() > 0) req->world_size = *world_size;
    if (expert_parallel_option->count() > 0) req->expert_parallel = *expert_parallel;
    if (tp_option->count() > 0) req->tp = *tp;
    if (pp_option->count() > 0) req->pp = *pp;
    if (vpp_option->count() > 0) req->vpp = *vpp;
    if (distributed_optimizer_option->count() > 0) req->distributed_optimizer = *distributed_optimizer;
    return jobs::run_reshard(*req, std::cout).exit_code;
  });
}

}  // namespace ckpt::cli
