// consolidate and convert: read SRC, select and cast entries, print the plan
// (--dry-run) or write one output file (or a sharded safetensors set).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "jobs/common.h"

namespace ckpt::jobs {

struct ConsolidateRequest {
  CommonOptions common;
  std::string output;
  std::string format;                // pt|safetensors|hdf5; empty: by the output's extension
  std::string max_shard_size;        // safetensors
  std::string compression = "none";  // HDF5: none|gzip
  bool finite = false;               // count NaN/Inf in every tensor written (exit 1 when any)
  std::string part;                  // --part I/N|auto|finalize: this process's share (exec/parted_output.h)
};

// The plan goes to `out` on --dry-run; logs and progress to stderr.
// --format's values: every output format's name and aliases, in order.
std::vector<std::string> output_format_choices();

JobReport run_consolidate(const ConsolidateRequest& request, std::ostream& out);

}  // namespace ckpt::jobs
