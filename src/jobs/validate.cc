#include "jobs/validate.h"

#include "core/error.h"
#include "core/units.h"

namespace ckpt::jobs {

JobReport run_validate(const ValidateRequest& req, std::ostream& out) {
  check::ValidateOptions options = req.check;
  options.files = req.common.files;
  options.tag = req.common.tag;
  options.only = req.common.only;
  options.param_layout = req.common.param_layout;
  const JobOptions job = settle(req.common);
  options.device = job.device;
  options.threads = job.threads;
  options.memory = job.memory;
  options.force = req.common.force;
  if (req.common.source.empty() && options.files.empty())
    fail_invalid("no checkpoint given: SRC or --files is required");
  if (options.sha256 && options.write_manifest.empty()) fail_invalid("--sha256 applies to --write-manifest");
  check::ValidateReport result = check::validate_checkpoint(req.common.source, options);
  if (req.json)
    // A name pickled with a lone surrogate is not UTF-8: shown as U+FFFD, never an internal error.
    out << check::report_to_json(result).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else
    check::print_report(result, out);
  JobReport report;
  report.summary = "validated " + result.source;
  report.tensors = result.tensors;
  report.dry_run = true;
  report.exit_code = result.exit_code();
  return report;
}

}  // namespace ckpt::jobs
