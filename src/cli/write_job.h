// What consolidate and convert share: read SRC, select and cast entries,
// print the plan (--dry-run) or write one output file.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace ckpt::cli {

struct WriteJobOptions {
  std::string source;
  std::vector<std::string> files;  // --files: per-rank files listed one by one, instead of SRC
  std::string output;
  std::string only;
  std::string keys;
  std::string dtype = "keep";
  int threads = 0;
  std::string memory_limit = "256M";
  bool dry_run = false;
  bool no_fsync = false;
  bool force = false;
  std::string format;          // --format: pt|safetensors|hdf5; empty: by the output's extension
  std::string max_shard_size;  // --max-shard-size (safetensors)
  std::string compression = "none";  // --compression (HDF5): none|gzip
  std::string device = "auto";       // --device: auto|cpu|cuda
  bool finite = false;               // --finite: count NaN/Inf in every tensor written
};

// Binds the shared options to a subcommand.
void bind_write_job_options(CLI::App* sub, WriteJobOptions& opt);
int run_write_job(const WriteJobOptions& opt);

}  // namespace ckpt::cli
