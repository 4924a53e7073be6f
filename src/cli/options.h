// The one binder of the options the commands share (jobs::CommonOptions):
// each command names the ones it takes, and every command gets the same
// spelling, help text and value checks.
#pragma once

#include <CLI/CLI.hpp>

#include "jobs/common.h"

namespace ckpt::cli {

enum CommonOption : unsigned {
  kSource = 1u << 0,          // SRC
  kFiles = 1u << 1,           // --files
  kOnly = 1u << 2,            // --only model|optim
  kKeys = 1u << 3,            // --keys
  kDtype = 1u << 4,           // --dtype
  kDevice = 1u << 5,          // --device auto|cpu|cuda
  kThreads = 1u << 6,         // --threads
  kMemoryLimit = 1u << 7,     // --memory-limit
  kDryRun = 1u << 8,          // --dry-run
  kForce = 1u << 9,           // --force
  kNoFsync = 1u << 10,        // --no-fsync
  kMaxOutputSize = 1u << 11,  // --max-output-size
  kNoVerify = 1u << 12,       // --no-verify
  kExcludeFrozen = 1u << 13,  // --exclude-frozen
};

// Help sections, in the order a user decides: what to read, what to keep,
// how to convert it, where to write, how fast.
inline constexpr const char* kInputGroup = "Input";
inline constexpr const char* kSelectionGroup = "Selection";
inline constexpr const char* kConversionGroup = "Conversion";
inline constexpr const char* kOutputGroup = "Output";
inline constexpr const char* kPerformanceGroup = "Performance";

// The help's footer: examples, the exit codes this command can return, and
// any notes (a command reading a SRC: jobs::source_kinds_help(), every kind
// of SRC the registered formats detect).
void set_footer(CLI::App* sub, std::initializer_list<const char*> examples, const char* exit_codes,
                const std::string& notes = "");

struct CommonHelp {
  const char* source = "Checkpoint of any kind listed below; per-rank files: a directory or a quoted glob";
  const char* only = "Keep only this top-level entry (per-rank files: read only that family)";
  const char* keys = "Keep only entries whose dotted path matches this regex (searched)";
  const char* device =
      "Where casts and scans run: cuda (error if none), cpu, or auto (CUDA when built in and a device is visible)";
  const char* threads = "Host threads for gathers, casts and scans (0: all)";
  const char* memory_limit = "Budget for reassembly buffers, e.g. 512M";
  const char* dry_run = "Print the plan; write nothing";
  const char* force = "Overwrite an existing output";
};

void bind_common(CLI::App* sub, jobs::CommonOptions& opt, unsigned which, const CommonHelp& help = {});

}  // namespace ckpt::cli
