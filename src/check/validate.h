// `ckptconv validate`: every check of a checkpoint that needs no output,
// each problem reported (not just the first) with its file, rank and key.
//
//   reading     the reader of SRC's family with a ProblemSink: every file
//               present and readable, zip records well-formed with their
//               CRC-32 verified, pickles decoded under the safe policy,
//               metadata consistent, ranks complete and agreeing
//   coverage    every tensor's chunks inside their storage, covering it
//               exactly (model/validate.h)
//   optimizer   optimizer state against param_groups and the model
//   finite      (--finite) NaN/Inf counts of every floating tensor
//   keys        (--expect-keys, --expect-world-size)
//   manifest    (--write-manifest, --manifest) file and tensor checksums
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "check/manifest.h"
#include "core/memory_budget.h"
#include "core/problems.h"
#include "exec/backend.h"

namespace ckpt::check {

inline constexpr int kValidateSchemaVersion = 1;

struct ValidateOptions {
  std::vector<std::string> files;  // --files instead of SRC
  std::string only;                // per-rank families: read only "model" or "optim" files
  std::string tag;                 // DeepSpeed: the tag directory (default: `latest`)
  std::string param_layout;        // --param-layout: FSDP1 flat parameters' names, shapes and order
  bool finite = false;
  int expect_world_size = -1;
  std::string expect_keys_file;   // one key per line; "" for none
  std::string write_manifest;     // path, or ""
  std::string manifest;           // path to verify against, or ""
  bool sha256 = false;            // --write-manifest with SHA-256 instead of XXH3-64
  bool force = false;             // overwrite an existing --write-manifest file
  Device device = Device::kAuto;  // for the finite scan only (kAuto: the CPU, see validate.cc)
  int threads = 0;
  MemoryBudget memory{};  // --memory-limit, shared by the checksum streams and scan workers
};

struct NonFinite {
  std::string key;
  DType dtype;
  uint64_t elements = 0;
  FiniteCounts counts;
};

struct ValidateReport {
  std::string source;
  std::string checkpoint;  // the one read, when SRC is a folder of them (--tag, or its only one)
  std::string format;      // "" when SRC could not be read at all
  int world_size = -1;     // -1 when unknown
  uint64_t files = 0, tensors = 0, tensor_bytes = 0;  // as the metadata declares them, when it does
  uint64_t files_missing = 0, tensors_unread = 0;     // of those, not there / not read whole
  bool readable = true;                               // false: SRC is missing or no checkpoint of a known kind
  std::vector<std::string> checks;
  std::vector<Problem> problems;
  std::vector<std::string> notes;
  // --finite
  bool finite_ran = false;
  std::string finite_device;
  uint64_t finite_tensors = 0;
  std::vector<NonFinite> nonfinite;
  // manifests
  std::string manifest_written, manifest_verified, manifest_algorithm;
  std::optional<ManifestComparison> manifest_comparison;

  // 0 valid; 1 problems found; 3 SRC unreadable, anything unsafe in it, or
  // content of a kind validate cannot interpret (Unimplemented).
  int exit_code() const;
};

// Runs every check. Throws only for usage errors (InvalidArgument: bad
// options, an unreadable --expect-keys or --manifest file) and when the
// manifest cannot be written (OutputFailed); everything wrong with the
// checkpoint is in the report.
ValidateReport validate_checkpoint(const std::string& src, const ValidateOptions& options);

nlohmann::ordered_json report_to_json(const ValidateReport& report);
void print_report(const ValidateReport& report, std::ostream& out);

}  // namespace ckpt::check
