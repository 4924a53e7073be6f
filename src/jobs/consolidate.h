// consolidate and convert: read SRC, select and cast entries, print the plan
// (--dry-run) or write one output file (or a sharded safetensors set).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "jobs/common.h"
#include "jobs/requests.h"

namespace ckpt::jobs {

// The plan goes to `out` on --dry-run; logs and progress to stderr.
// --format's values: every output format's name and aliases, in order.
std::vector<std::string> output_format_choices();

JobReport run_consolidate(const ConsolidateRequest& request, std::ostream& out);

}  // namespace ckpt::jobs
