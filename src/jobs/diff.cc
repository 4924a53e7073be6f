#include "jobs/diff.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/progress.h"
#include "core/units.h"
#include "diff/checkpoint_diff.h"
#include "diff/diff_report.h"
#include "io/s3_url.h"
#include "model/tree_walk.h"

namespace ckpt::jobs {
namespace {

// One side, read and selected as consolidate does. A side that holds no
// "model" or "optim" entry and is asked for one is an export made with
// `--only X` (X's state dict at its top level): it is compared whole, and
// the log says so. Any other selection that matches nothing is a usage
// error (exit 2) naming the side, never a silent comparison of nothing.
CheckpointModel read_side(const char* side, const std::string& src, const std::string& tag, const DiffRequest& req) {
  CommonOptions opt = req.common;
  opt.source = src;
  opt.tag = tag;
  opt.files.clear();
  opt.dtype = "keep";
  CheckpointModel read;
  try {
    read = read_source(opt);
  } catch (const Error& e) {
    // resolve_checkpoint says --tag; B's option is --tag-b.
    std::string message = e.message();
    const std::string tag_option = " --tag ";
    if (side[0] != 'B' || e.code() != ErrorCode::kInvalidArgument || message.find(tag_option) == std::string::npos)
      throw;
    for (auto at = message.find(tag_option); at != std::string::npos; at = message.find(tag_option, at + 1))
      message.replace(at, tag_option.size(), " --tag-b ");
    fail_invalid(message);
  }
  try {
    CheckpointModel model = select_source(read, opt);
    spdlog::debug("{}: {} ({}), {} tensors selected", side, src, model.format(), model.tensors.size());
    return model;
  } catch (const Error& e) {
    pickle::ValuePtr root = read.root ? mapping_of(read.root) : nullptr;
    bool holds_parts = root && root->is(pickle::Kind::kDict) && (root->get("model") || root->get("optim"));
    if (e.code() != ErrorCode::kInvalidArgument || opt.only.empty() || holds_parts) throw;
    spdlog::info("{}: {} has no '{}' entry: compared whole, as an export made with --only {}", side, src, opt.only,
                 opt.only);
    opt.only.clear();
    return select_source(std::move(read), opt);
  }
}

}  // namespace

JobReport run_diff(const DiffRequest& req, std::ostream& out) {
  if (req.rtol < 0 || req.atol < 0 || !std::isfinite(req.rtol) || !std::isfinite(req.atol))
    fail_invalid("--rtol and --atol must be finite and not negative");
  CommonOptions common = req.common;
  common.source = is_s3_url(req.a) ? req.a : req.b;  // an s3:// side's read-ahead is part of the budget
  const JobOptions job = settle(common);
  if (job.device == Device::kCuda)
    fail_invalid("--device cuda: diff compares on the CPU (its comparison has no CUDA path yet); use auto or cpu");
  DiffOptions options;
  options.tolerance = {req.rtol, req.atol};
  options.ignore_dtype = req.ignore_dtype;
  options.strict = req.strict;
  options.stream = {job.memory.diff(), job.threads};
  CheckpointModel a = with_context("A", [&] { return read_side("A", req.a, req.tag_a, req); });
  CheckpointModel b = with_context("B", [&] { return read_side("B", req.b, req.tag_b, req); });
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
    // A name pickled with a lone surrogate is not UTF-8: shown as U+FFFD, never an internal error.
    out << diff_to_json(result).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else if (req.summary)
    print_diff_summary(result, out);
  else
    print_diff_table(result, out, req.all);
  report.exit_code = result.equal() ? 0 : 1;
  return report;
}

}  // namespace ckpt::jobs
