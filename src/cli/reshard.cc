// `ckptconv reshard SRC -o DST --world-size N [--layout ...]`: options and
// printing; the work is jobs::run_reshard.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "jobs/reshard.h"

namespace ckpt::cli {

void register_reshard(CLI::App& app) {
  auto req = std::make_shared<jobs::ReshardRequest>();
  CLI::App* sub = app.add_subcommand(
      "reshard", "Rewrite a checkpoint for another world size: a DCP directory (FSDP2 layout) or per-rank FSDP files");
  CommonHelp help{
      .source =
          "DCP directory, per-rank files (a directory or a quoted glob), or a full state dict (.pt, safetensors, HDF5)",
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
      sub->add_option("--world-size", *world_size,
                      "Number of ranks to write (required, except for deepspeed-universal, which loads at any)")
          ->group(kOutputGroup);
  sub->add_option(
         "--layout", req->layout,
         "dcp (one __<r>_0.distcp per rank + .metadata), hf (torch's DCP Hugging Face layout: one "
         "shard-0000<r+1>-model-00001-of-00001.safetensors per rank, a model's tensors only), "
         "fsdp-sharded-tensor or fsdp-dtensor (one torch.save "
         "file per rank and family, as FSDP1 SHARDED_STATE_DICT), accelerate (an Accelerate checkpoint "
         "folder: pytorch_model_fsdp_0/ and optimizer_0/ as DCP, its other files copied), deepspeed-universal (a "
         "DeepSpeed universal checkpoint, DST = <root>/<tag>_universal, which a DeepSpeed engine with "
         "load_universal loads at any world size; <root>/latest_universal names it, unless one exists: see "
         "--update-latest), fsdp1-flat (FSDP1's "
         "LOCAL_STATE_DICT model files and raw optimizer files per rank, from FSDP1 flat-parameter files read "
         "with --param-layout), megatron (a Megatron-core torch_dist checkpoint, from one read whole, which "
         "megatron-core loads at any TP x PP x DP); default: the "
         "source's own, required for a full state dict")
      ->check(CLI::IsMember({"dcp", "hf", "fsdp-sharded-tensor", "fsdp-dtensor", "accelerate", "deepspeed-universal",
                             "fsdp1-flat", "megatron"}))
      ->group(kOutputGroup);
  sub->add_flag("--update-latest", req->update_latest,
                "deepspeed-universal: point an existing <root>/latest_universal at the new tag folder (without it "
                "an existing one is kept; a missing one is always written)")
      ->group(kOutputGroup);
  bind_common(sub, req->common, kOnly | kDtype | kDevice | kThreads, help);
  sub->add_option(
         "--mesh-device", req->mesh_device,
         "fsdp-dtensor: device type of the DeviceMesh the files name (cpu, cuda); default: the source's, else cpu")
      ->group(kOutputGroup);
  sub->add_option("--mesh-dim-names", req->mesh_dim_names,
                  "fsdp-dtensor: name of the mesh dimension (veRL: fsdp); default: the source's, else none")
      ->group(kOutputGroup);
  bind_common(sub, req->common, kMemoryLimit | kDryRun | kForce | kNoFsync | kMaxOutputSize | kNoVerify, help);
  sub->add_option("--part", req->part,
                  "Write worker I's share of the output files (I/N, 0-based; auto: from Slurm, Open MPI, PMI or "
                  "torchrun); the worker completing the set finalizes DST (finalize: only that step)")
      ->group(kPerformanceGroup);
  set_footer(
      sub,
      {"ckptconv reshard ckpt/step-1000 -o ckpt-ws4 --world-size 4",
       "ckptconv reshard hf-model/ -o ckpt-ws8 --world-size 8 --layout dcp",
       "ckptconv reshard ds_ckpt -o fsdp-ws2 --world-size 2 --layout fsdp-dtensor --dry-run"},
      "0 written; 2 usage error; 3 input unreadable, corrupt, unsupported or unsafe; 4 output not written, or a\n"
      "size or memory limit hit; 5 installation problem or internal error; 130/143/129 stopped by\n"
      "SIGINT/SIGTERM/SIGHUP (nothing written).",
      kSourceKinds);
  add_runner(sub, [req, world_size, world_size_option] {
    if (world_size_option->count() > 0) req->world_size = *world_size;
    return jobs::run_reshard(*req, std::cout).exit_code;
  });
}

}  // namespace ckpt::cli
