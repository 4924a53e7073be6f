#include "formats/detect.h"

#include <filesystem>

#include "core/error.h"
#include "formats/dcp/dcp_reader.h"
#include "formats/fsdp_ranks/fsdp_ranks_reader.h"
#include "formats/fsdp_ranks/rank_file_names.h"
#ifdef CKPT_HAVE_HDF5
#include "formats/hdf5/hdf5_reader.h"
#endif
#include "formats/safetensors/safetensors_format.h"
#include "formats/safetensors/safetensors_reader.h"
#include "formats/torch_pt/pt_reader.h"
#include "model/plain_values.h"

namespace ckpt {
namespace fs = std::filesystem;

const char* source_kind_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::kTorchPt: return "torch.save file";
    case SourceKind::kDcpDir: return "DCP directory";
    case SourceKind::kFsdpRanks: return "per-rank files";
    case SourceKind::kSafetensors: return "safetensors file";
    case SourceKind::kSafetensorsIndex: return "sharded safetensors (index)";
    case SourceKind::kHdf5: return "HDF5 file";
  }
  return "?";
}

SourceKind detect_source(const std::string& src) {
  std::error_code ec;
  auto status = fs::status(src, ec);
  if ((ec || !fs::exists(status)) && fsdp_ranks::is_glob_pattern(src)) return SourceKind::kFsdpRanks;
  if (ec || !fs::exists(status)) fail(ErrorCode::kNotFound, src + ": no such file or directory");
  if (fs::is_directory(status)) {
    // A DCP directory has a global .metadata, or per-rank __<rank>.metadata
    // files when it was saved without rank coordination.
    if (fs::exists(fs::path(src) / ".metadata") || fs::exists(fs::path(src) / "__0.metadata")) return SourceKind::kDcpDir;
    if (!fsdp_ranks::list_rank_files(src).empty()) return SourceKind::kFsdpRanks;
    fail(ErrorCode::kUnimplemented,
         src + ": directory is not a recognised checkpoint (no DCP .metadata, no per-rank *rank{r}*.pt files)");
  }
  SourcePtr source = open_file_source(src);
  if (torch_pt::is_torch_zip(*source) || torch_pt::is_legacy_torch_save(*source)) return SourceKind::kTorchPt;
  if (safetensors::is_safetensors_index(src)) return SourceKind::kSafetensorsIndex;
  static const char kHdf5Signature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  if (source->size() >= 8 && source->read_string(0, 8) == std::string(kHdf5Signature, 8)) return SourceKind::kHdf5;
  if (safetensors::looks_like_safetensors(*source)) return SourceKind::kSafetensors;
  fail_data_loss(src + ": not a recognised checkpoint file (expected a torch.save zip, safetensors, a .safetensors.index.json or HDF5)");
}

namespace {

CheckpointModel read_by_kind(const std::string& src, const ReadOptions& options) {
  if (!options.files.empty()) {
    if (!src.empty()) fail_invalid("give either SRC or --files, not both");
    return fsdp_ranks::read_fsdp_rank_files(options.files, options.files.front() + " (and " +
                                            std::to_string(options.files.size() - 1) + " more files)", options.only,
                                            options.problems);
  }
  if (src.empty()) fail_invalid("no checkpoint given: SRC or --files is required");
  switch (detect_source(src)) {
    case SourceKind::kTorchPt: return torch_pt::read_pt_file(src, options.problems);
    case SourceKind::kDcpDir: return dcp::read_dcp_dir(src, options.problems);
    case SourceKind::kFsdpRanks: return fsdp_ranks::read_fsdp_ranks(src, options.only, options.problems);
    case SourceKind::kSafetensors: return safetensors::read_safetensors_file(src);
    case SourceKind::kSafetensorsIndex: return safetensors::read_safetensors_index(src, options.problems);
    case SourceKind::kHdf5:
#ifdef CKPT_HAVE_HDF5
      return hdf5::read_hdf5_file(src);
#else
      fail(ErrorCode::kUnimplemented, src + ": this ckptconv was built without HDF5 (CKPT_WITH_HDF5=OFF)");
#endif
  }
  fail(ErrorCode::kInternal, src + ": unhandled source kind");
}

}  // namespace

CheckpointModel read_checkpoint(const std::string& src, const ReadOptions& options) {
  CheckpointModel model = read_by_kind(src, options);
  if (model.root) {
    with_context(model.source, [&] {
      require_plain_values(*model.root);
      require_bounded_expansion(*model.root);
    });
  }
  return model;
}

}  // namespace ckpt
