// validate: every check of a checkpoint that writes nothing (but an optional
// manifest); the checks themselves live in check/validate.h.
#pragma once

#include <ostream>

#include "check/validate.h"
#include "jobs/common.h"

namespace ckpt::jobs {

struct ValidateRequest {
  CommonOptions common;          // source, files, only, device, threads, memory_limit, force
  check::ValidateOptions check;  // the check-specific options (files/only/device/... are taken from `common`)
  bool json = false;
};

// The report goes to `out` (text or JSON); exit_code 0 valid, 1 problems, 3 unreadable or unsafe.
JobReport run_validate(const ValidateRequest& request, std::ostream& out);

}  // namespace ckpt::jobs
