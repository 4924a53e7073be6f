// Integrity manifests (validate --write-manifest / --manifest): a checksum of
// every file of a checkpoint and of every tensor's logical bytes
// (check/tensor_scan.h), so a later run can prove the checkpoint unchanged
// and name what changed. Tensor checksums do not depend on the layout, so a
// manifest of a DCP directory also verifies its consolidated or resharded
// copies (files are then not compared). JSON, documented in docs/json-schema.md.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/problems.h"
#include "exec/checksum.h"
#include "model/checkpoint_model.h"

namespace ckpt::check {

inline constexpr int kManifestSchemaVersion = 1;

struct ManifestFile {
  std::string path;  // relative to the checkpoint's directory
  uint64_t bytes = 0;
  std::string checksum;
};

struct ManifestTensor {
  std::string key;  // dotted path, as inspect prints it
  std::string dtype;
  Shape shape;
  std::string checksum;
};

struct Manifest {
  ChecksumAlgorithm algorithm = ChecksumAlgorithm::kXxh3_64;
  std::string source;
  std::string format;
  int world_size = -1;
  std::vector<ManifestFile> files;
  std::vector<ManifestTensor> tensors;
};

nlohmann::ordered_json manifest_to_json(const Manifest& manifest);
// DataLoss naming `path` when the JSON is not a manifest of a known version.
Manifest manifest_from_json(const nlohmann::ordered_json& json, const std::string& path);
Manifest read_manifest(const std::string& path);
// Atomically (temp file, fsync, rename); InvalidArgument when `path` exists and !force.
void write_manifest(const Manifest& manifest, const std::string& path, bool force);

struct ManifestComparison {
  bool files_compared = true;
  std::string note;  // why files were not compared
  int changed = 0, missing = 0, added = 0;
};

// Reports every file and tensor of `recorded` that changed or is missing
// from `now`, and every one `now` has that `recorded` lacks. Files are
// compared only when both describe the same layout (format and world size).
ManifestComparison compare_manifests(const Manifest& recorded, const Manifest& now, const std::string& manifest_path,
                                     ProblemSink& sink);

}  // namespace ckpt::check
