#include "cli/options.h"

#include <map>

namespace ckpt::cli {

void set_footer(CLI::App* sub, std::initializer_list<const char*> examples, const char* exit_codes,
                const std::string& notes) {
  std::string text;
  if (!notes.empty()) text += notes + "\n\n";
  text += "Examples:\n";
  for (const char* e : examples) text += std::string("  ") + e + "\n";
  text += std::string("\nExit codes: ") + exit_codes;
  sub->footer(text);
}

void bind_common(CLI::App* sub, jobs::CommonOptions& opt, unsigned which, const CommonHelp& help) {
  if (which & kSource) {
    sub->add_option("SRC", opt.source, help.source);
    sub->add_option("--tag", opt.tag,
                    "SRC holds several checkpoints (step-100/, checkpoint_3/, DeepSpeed tags): read this one; "
                    "'latest' (also what is read without --tag, said in a note) = the one the file `latest` "
                    "names, else the highest-numbered complete one")
        ->group(kInputGroup);
  }
  if (which & kFiles)
    sub->add_option("--files", opt.files, "Per-rank files listed one by one (instead of SRC)")
        ->expected(1, -1)
        ->group(kInputGroup);
  if (which & kFiles)
    sub->add_option("--param-layout", opt.param_layout,
                    "FSDP1 flat-parameter files (LOCAL_STATE_DICT, raw optimizer.state_dict()): a checkpoint of the "
                    "same model giving its parameter names, shapes and order (a torch.save'd state_dict(), FSDP "
                    "full or sharded files, a DCP checkpoint)")
        ->check(CLI::Validator(
            [](std::string& path) {
              // An s3:// object is looked up when read (exit 3 when missing), not by CLI11.
              if (path.rfind("s3://", 0) == 0) return std::string();
              return (CLI::ExistingFile | CLI::ExistingDirectory)(path);
            },
            "PATH(existing)"))
        ->group(kInputGroup);
  if (which & kOnly) {
    sub->add_option("--only", opt.only, help.only)->check(CLI::IsMember({"model", "optim"}))->group(kSelectionGroup);
    sub->add_option("--allow-global", opt.allow_globals,
                    "Read calls of this global (MODULE.NAME, repeatable) as opaque records {'__global__', 'args', "
                    "'state'}: never called, never written as a callable (docs/pickle-globals.md)")
        ->check(CLI::Validator(
            [](std::string& g) { return g.find('.') == std::string::npos ? std::string("not MODULE.NAME") : ""; },
            "MODULE.NAME"))
        ->group(kInputGroup);
  }
  if (which & kKeys) sub->add_option("--keys", opt.keys, help.keys)->group(kSelectionGroup);
  if (which & kExcludeFrozen)
    sub->add_flag("--exclude-frozen", opt.exclude_frozen,
                  "Leave out parameters the job did not train (DeepSpeed ZeRO checkpoints record them), as "
                  "zero_to_fp32 --exclude_frozen_parameters does")
        ->group(kSelectionGroup);
  if (which & kDtype) {
    // torch's names are accepted for the short ones inspect does not print.
    auto dtype_names = [] {
      return CLI::Validator(
          [](std::string& value) {
            static const std::map<std::string, std::string> kTorchNames = {
                {"float32", "fp32"},        {"float", "fp32"}, {"bfloat16", "bf16"},
                {"float16", "fp16"},        {"half", "fp16"},  {"float8_e4m3fn", "fp8_e4m3"},
                {"float8_e5m2", "fp8_e5m2"}};
            if (auto it = kTorchNames.find(value); it != kTorchNames.end()) value = it->second;
            return std::string();
          },
          "");
    };
    const auto dtypes = CLI::IsMember({"keep", "fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"});
    sub->add_option("--dtype", opt.dtype,
                    "Cast the model's floating-point tensors; an optimizer's state keeps its dtypes (see "
                    "--optim-dtype); torch's names (float32, float, bfloat16, float16, half, float8_e4m3fn, "
                    "float8_e5m2) are accepted too")
        ->transform(dtype_names())
        ->check(dtypes)
        ->capture_default_str()
        ->group(kConversionGroup);
    sub->add_option("--optim-dtype", opt.optim_dtype,
                    "Cast the optimizer's floating-point state (exp_avg, exp_avg_sq, momentum buffers, fp32 "
                    "masters; step counters excepted); default keep: a resumed job reads the state it saved")
        ->transform(dtype_names())
        ->check(dtypes)
        ->capture_default_str()
        ->group(kConversionGroup);
  }
  if (which & kThreads) sub->add_option("--threads", opt.threads, help.threads)->group(kPerformanceGroup);
  if (which & kDevice)
    sub->add_option("--device", opt.device, help.device)
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
        ->capture_default_str()
        ->group(kPerformanceGroup);
  if (which & kMemoryLimit)
    sub->add_option("--memory-limit", opt.memory_limit, help.memory_limit)
        ->capture_default_str()
        ->group(kPerformanceGroup);
  if (which & kDryRun) sub->add_flag("--dry-run", opt.dry_run, help.dry_run)->group(kOutputGroup);
  if (which & kForce) sub->add_flag("--force", opt.force, help.force)->group(kOutputGroup);
  if (which & kMaxOutputSize)
    sub->add_option(
           "--max-output-size", opt.max_output_size,
           "Refuse (exit 4, before writing) an output of more tensor data than SIZE, e.g. 100G; the free space "
           "where the output goes is always checked")
        ->group(kOutputGroup);
  if (which & kNoVerify)
    sub->add_flag("--no-verify", opt.no_verify,
                  "Skip the CRC-32 check of every source record read (trusted input only: a corrupt byte is then "
                  "copied into the output)")
        ->group(kPerformanceGroup);
  if (which & kNoFsync)
    sub->add_flag(
           "--no-fsync", opt.no_fsync,
           "Skip the fsync before the output is renamed into place (faster; the output is still whole or absent, "
           "but not guaranteed to survive a power loss)")
        ->group(kOutputGroup);
}

}  // namespace ckpt::cli
