#include "formats/detect.h"

#include <filesystem>

#include "core/error.h"
#include "formats/dcp/dcp_reader.h"
#include "formats/fsdp_ranks/fsdp_ranks_reader.h"
#include "formats/fsdp_ranks/rank_file_names.h"
#include "formats/torch_pt/pt_reader.h"

namespace ckpt {
namespace fs = std::filesystem;

const char* source_kind_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::kTorchPt: return "torch.save file";
    case SourceKind::kDcpDir: return "DCP directory";
    case SourceKind::kFsdpRanks: return "per-rank files";
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
  fail_data_loss(src + ": not a recognised checkpoint file (expected a torch.save zip)");
}

CheckpointModel read_checkpoint(const std::string& src, const ReadOptions& options) {
  if (!options.files.empty()) {
    if (!src.empty()) fail_invalid("give either SRC or --files, not both");
    return fsdp_ranks::read_fsdp_rank_files(options.files, options.files.front() + " (and " +
                                            std::to_string(options.files.size() - 1) + " more files)", options.only);
  }
  if (src.empty()) fail_invalid("no checkpoint given: SRC or --files is required");
  switch (detect_source(src)) {
    case SourceKind::kTorchPt: return torch_pt::read_pt_file(src);
    case SourceKind::kDcpDir: return dcp::read_dcp_dir(src);
    case SourceKind::kFsdpRanks: return fsdp_ranks::read_fsdp_ranks(src, options.only);
  }
  fail(ErrorCode::kInternal, src + ": unhandled source kind");
}

}  // namespace ckpt
