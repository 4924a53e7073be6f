#include "jobs/diff.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/progress.h"
#include "core/units.h"
#include "diff/checkpoint_diff.h"
#include "diff/diff_report.h"

namespace ckpt::jobs {
namespace {

// One side, read and selected as consolidate does. A side where nothing is
// selected is an empty checkpoint (its selection error kept in
// `unselected`): the other side's keys are then "only in" it, a difference
// rather than an error.
CheckpointModel read_side(const char* side, const std::string& src, const std::string& tag, const DiffRequest& req,
                          std::optional<Error>& unselected) {
  CommonOptions opt = req.common;
  opt.source = src;
  opt.tag = tag;
  opt.files.clear();
  opt.dtype = "keep";
  CheckpointModel model;
  try {
    model = read_source(opt);
  } catch (const Error& e) {
    // resolve_checkpoint says --tag; B's option is --tag-b.
    std::string message = e.message();
    const std::string tag = " --tag ";
    if (side[0] != 'B' || e.code() != ErrorCode::kInvalidArgument || message.find(tag) == std::string::npos) throw;
    for (auto at = message.find(tag); at != std::string::npos; at = message.find(tag, at + 1))
      message.replace(at, tag.size(), " --tag-b ");
    fail_invalid(message);
  }
  try {
    model = select_source(std::move(model), opt);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;
    unselected = e;
    model.root = nullptr;
    model.tensors.clear();
    return model;
  }
  spdlog::debug("{}: {} ({}), {} tensors selected", side, src, model.format(), model.tensors.size());
  return model;
}

}  // namespace

JobReport run_diff(const DiffRequest& req, std::ostream& out) {
  if (req.rtol < 0 || req.atol < 0 || !std::isfinite(req.rtol) || !std::isfinite(req.atol))
    fail_invalid("--rtol and --atol must be finite and not negative");
  if (parse_device(req.common.device) == Device::kCuda)
    fail_invalid("--device cuda: diff compares on the CPU (its comparison has no CUDA path yet); use auto or cpu");
  DiffOptions options;
  options.tolerance = {req.rtol, req.atol};
  options.ignore_dtype = req.ignore_dtype;
  options.strict = req.strict;
  options.stream = {parse_size(req.common.memory_limit), req.common.threads};
  std::optional<Error> unselected_a, unselected_b;
  CheckpointModel a = with_context("A", [&] { return read_side("A", req.a, req.tag_a, req, unselected_a); });
  CheckpointModel b = with_context("B", [&] { return read_side("B", req.b, req.tag_b, req, unselected_b); });
  // Nothing selected on either side is a usage error, as for consolidate.
  if (unselected_a && unselected_b) throw *unselected_a;
  JobClock clock;
  JobReport report;
  report.bytes = diff_read_bytes(a, b);
  DiffReport result;
  {
    ProgressScope progress("diff", report.bytes);
    result = diff_models(a, b, options);
  }
  report.tensors = result.tensors.size();
  report.summary = "compared " + req.a + " and " + req.b;
  report.seconds = clock.seconds();
  report.dry_run = true;  // nothing written
  spdlog::info("compared {} tensors ({} read) and {} values in {:.2f} s", result.tensors.size(),
               human_bytes(static_cast<double>(report.bytes)), result.values_compared, report.seconds);
  if (req.json)
    out << diff_to_json(result).dump(2) << "\n";
  else
    print_diff_table(result, out, req.all);
  report.exit_code = result.equal() ? 0 : 1;
  return report;
}

}  // namespace ckpt::jobs
