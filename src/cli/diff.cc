// `ckptconv diff A B`: are two checkpoints the same, within tolerance?
// A CI gate: exit 0 equal, 1 different (differences on stdout as a table or
// --json), 2 usage, 3 an input unreadable, corrupt or unsafe.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>

#include "cli/commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/units.h"
#include "diff/checkpoint_diff.h"
#include "diff/diff_report.h"
#include "exec/backend.h"
#include "formats/detect.h"
#include "model/validate.h"
#include "plan/select.h"

namespace ckpt::cli {
namespace {

struct DiffCliOptions {
  std::string a, b;
  double rtol = 0, atol = 0;
  std::string only, keys;
  bool json = false;
  bool all = false;
  bool ignore_dtype = false;
  std::string device = "auto";
  int threads = 0;
  std::string memory_limit = "256M";
};

// One side, read, selected (--only/--keys as consolidate applies them) and
// validated. A side where nothing is selected is an empty checkpoint (its
// selection error kept in `unselected`): the other side's keys are then
// "only in" it, a difference rather than an error.
CheckpointModel read_side(const char* side, const std::string& src, const DiffCliOptions& opt,
                          std::optional<Error>& unselected) {
  CheckpointModel model = read_checkpoint(src, {{}, opt.only});
  std::string only = model.format == "fsdp-ranks" ? "" : opt.only;
  try {
    model = select_entries(model, {only, opt.keys, std::nullopt});
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;
    unselected = e;
    model.root = nullptr;
    model.tensors.clear();
    return model;
  }
  require_valid(model);
  spdlog::debug("{}: {} ({}), {} tensors selected", side, src, model.format, model.tensors.size());
  return model;
}

int run_diff(const DiffCliOptions& opt) {
  if (opt.rtol < 0 || opt.atol < 0 || !std::isfinite(opt.rtol) || !std::isfinite(opt.atol))
    fail_invalid("--rtol and --atol must be finite and not negative");
  if (parse_device(opt.device) == Device::kCuda)
    fail_invalid("--device cuda: diff compares on the CPU (its comparison has no CUDA path yet); use auto or cpu");
  DiffOptions options;
  options.tolerance = {opt.rtol, opt.atol};
  options.ignore_dtype = opt.ignore_dtype;
  options.stream = {parse_size(opt.memory_limit), opt.threads};
  std::optional<Error> unselected_a, unselected_b;
  CheckpointModel a = with_context("A", [&] { return read_side("A", opt.a, opt, unselected_a); });
  CheckpointModel b = with_context("B", [&] { return read_side("B", opt.b, opt, unselected_b); });
  // Nothing selected on either side (or a bad regex) is a usage error, as for consolidate.
  if (unselected_a && unselected_b) throw *unselected_a;
  auto start = std::chrono::steady_clock::now();
  uint64_t read_bytes = diff_read_bytes(a, b);
  DiffReport report;
  {
    ProgressScope progress("diff", read_bytes);
    report = diff_models(a, b, options);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("compared {} tensors ({} read) and {} values in {:.2f} s", report.tensors.size(),
               human_bytes(static_cast<double>(read_bytes)), report.values_compared, secs);
  if (opt.json)
    std::cout << diff_to_json(report).dump(2) << "\n";
  else
    print_diff_table(report, std::cout, opt.all);
  return report.equal() ? 0 : 1;
}

}  // namespace

void register_diff(CLI::App& app) {
  auto opt = std::make_shared<DiffCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "diff", "Compare two checkpoints of any formats and layouts (keys, dtypes, shapes, values); exit 0 equal, 1 different");
  sub->footer(
      "Elements a (of A) and b (of B) are equal when a == b, both are NaN, or |a - b| <= atol + rtol * |b|\n"
      "(torch.isclose with equal_nan=True: relative to B). The defaults, rtol 0 and atol 0, ask for numerically\n"
      "identical values. A dtype difference is a difference unless --ignore-dtype; a shape difference always is.\n"
      "Exit codes: 0 equal, 1 different, 2 usage error, 3 an input unreadable, corrupt or unsafe.");
  sub->add_option("A", opt->a, "First checkpoint (any SRC ckptconv reads)")->required();
  sub->add_option("B", opt->b, "Second checkpoint; relative differences are taken against B")->required();
  sub->add_option("--rtol", opt->rtol, "Relative tolerance (of |b|)")->capture_default_str();
  sub->add_option("--atol", opt->atol, "Absolute tolerance")->capture_default_str();
  sub->add_option("--only", opt->only, "Compare only this top-level entry")->check(CLI::IsMember({"model", "optim"}));
  sub->add_option("--keys", opt->keys, "Compare only entries whose dotted path matches this regex (searched)");
  sub->add_flag("--ignore-dtype", opt->ignore_dtype,
                "A dtype difference alone is not a difference (values are still compared, in double)");
  sub->add_flag("--json", opt->json, "Print JSON (schema in docs/json-schema.md)");
  sub->add_flag("--all", opt->all, "Also list the tensors that are equal, with their max differences");
  sub->add_option("--device", opt->device, "auto|cpu: comparisons run on CPU threads")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--threads", opt->threads, "Threads for comparisons (0: all hardware threads)");
  sub->add_option("--memory-limit", opt->memory_limit, "Budget for the row slabs of both tensors, e.g. 512M")
      ->capture_default_str();
  add_runner(sub, [opt] { return run_diff(*opt); });
}

}  // namespace ckpt::cli
