// diff: are two checkpoints the same, within tolerance? A CI gate: exit 0
// equal, 1 different.
#pragma once

#include <ostream>
#include <string>

#include "jobs/common.h"

namespace ckpt::jobs {

struct DiffRequest {
  std::string a, b;
  std::string tag_a, tag_b;  // --tag, --tag-b: the checkpoint to read when A or B is a folder of them
  CommonOptions common;      // only, keys, device, threads, memory_limit (source/files/tag unused)
  double rtol = 0, atol = 0;
  bool json = false;
  bool all = false;      // also list the equal tensors
  bool summary = false;  // counts and the worst tensors only (diff_report.h print_diff_summary)
  bool ignore_dtype = false;
  bool strict = false;  // a BytesIO and its bytes differ
};

// The differences go to `out` (a table or JSON); exit_code 0 equal, 1 different.
JobReport run_diff(const DiffRequest& request, std::ostream& out);

}  // namespace ckpt::jobs
