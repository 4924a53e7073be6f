// What every job shares: the options common to the commands (one struct, one
// binder in cli/options.cc), reading and selecting the source in one place,
// the one policy for choosing a backend, and the report a job returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/memory_budget.h"
#include "exec/backend.h"
#include "exec/tensor_copy.h"
#include "formats/input_format.h"
#include "model/checkpoint_model.h"

namespace ckpt::jobs {

struct CommonOptions {
  std::string source;                      // SRC
  std::vector<std::string> files;          // --files: per-rank files listed one by one, instead of SRC
  std::string tag;                         // --tag: DeepSpeed tag directory (default: `latest`)
  std::string param_layout;                // --param-layout FILE: FSDP1 flat parameters' names, shapes and order
  std::string only;                        // --only model|optim
  std::vector<std::string> allow_globals;  // --allow-global MODULE.NAME: its calls read as opaque records
  std::string keys;                        // --keys REGEX
  bool exclude_frozen = false;             // --exclude-frozen: drop parameters the job did not train
  std::string dtype = "keep";              // --dtype keep|fp32|bf16|fp16: the model's tensors
  std::string optim_dtype = "keep";        // --optim-dtype: the optimizer's state
  std::string device = "auto";             // --device auto|cpu|cuda
  int threads = 0;                         // --threads (0: all)
  std::string memory_limit = "256M";
  bool dry_run = false;
  bool force = false;
  bool no_fsync = false;
  bool no_verify = false;       // --no-verify: skip the CRC-32 check of the source records a job reads
  std::string max_output_size;  // --max-output-size SIZE; empty: no limit but the free space
};

// CommonOptions settled: every value parsed once, in one place, typed.
struct JobOptions {
  std::optional<DType> cast_to;        // --dtype; nullopt: keep
  std::optional<DType> optim_cast_to;  // --optim-dtype; nullopt: keep
  Device device = Device::kAuto;       // --device
  int threads = 0;                     // --threads (0: all)
  MemoryBudget memory;                 // --memory-limit
  std::optional<uint64_t> max_output;  // --max-output-size
  std::string max_output_text;         // as given, for messages
};
// InvalidArgument (exit 2) naming the option for a value it does not take.
JobOptions settle(const CommonOptions& opt);

// What the readers take from the options (SRC's tag, --files, --only,
// --param-layout), the one place they are gathered.
ReadOptions read_options(const CommonOptions& opt);
// SRC (or --files) read; per-rank sources read only the --only family.
CheckpointModel read_source(const CommonOptions& opt);
// --only for the other sources (that top-level entry becomes the root, or
// stays under its key with keep_nesting: reshard), then --keys and --dtype;
// require_valid'ed. InvalidArgument when nothing is selected.
CheckpointModel select_source(CheckpointModel model, const CommonOptions& opt, bool keep_nesting = false);
// Both: the one place a source is read and selected.
CheckpointModel read_selected(const CommonOptions& opt, bool keep_nesting = false);

// The one backend policy: only arithmetic (casts, NaN/Inf scans) goes to a
// device; bytes that pass unchanged are copied file to file, and LibTorch is
// loaded only when a cast needs it. --device cuda is honoured (or refused
// when there is none) even without arithmetic, so a wrong request is an error.
std::unique_ptr<Backend> choose_backend(const JobOptions& opt, bool arithmetic);

// The record verifier a writing job shares across its tensors (CopyOptions
// verify), or null under --no-verify.
std::shared_ptr<RecordVerifier> record_verifier(const CommonOptions& opt);

// Before anything is written: ResourceExhausted (exit 4) when the output's
// tensor bytes exceed --max-output-size or the free space where `output`
// goes. The plan knows the size; a full disk mid-write would leave nothing
// useful and take time to find out.
void check_output_size(uint64_t bytes, const std::string& output, const JobOptions& opt);

// Before reading the source: the mistakes a user makes with OUT, each
// answered with what to do. A file output (`directory` false) that is an
// existing directory or ends in '/' is a usage error naming a file to give;
// a parent that exists but is no directory is OutputFailed (exit 4) naming
// it, for both kinds of output. Missing parents are the job's to make
// (CreatedDirectories::parents_of in jobs/output_folder.h), once nothing
// else refuses the output, and to remove again when it fails.
void check_output_place(const std::string& output, bool directory);

// After reading: InvalidArgument (exit 2) when OUT is an input file, lies
// inside the input's directory, or (a directory output) contains an input
// file, after resolving symlinks, --force or not: writing there would
// overwrite or delete the checkpoint being read.
void check_output_is_not_input(const std::string& output, const CheckpointModel& model);

// What a job did, for the CLI to print and for tests to assert on.
struct JobReport {
  std::string summary;  // "wrote out.pt", "wrote dst (dcp): 4 ranks"
  uint64_t tensors = 0;
  uint64_t bytes = 0;  // tensor bytes written (or read, for diff)
  double seconds = 0;
  bool dry_run = false;
  int exit_code = 0;
};

// Measures a job from construction; finish() fills seconds and logs the one
// epilogue line ("<summary>: N tensors, X in T s") unless it was a dry run.
class JobClock {
 public:
  JobClock() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const;
  void finish(JobReport& report) const;

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ckpt::jobs
