// Per-rank FSDP files: a directory of them, a glob pattern, or --files.
#include "formats/fsdp_ranks/fsdp_ranks_reader.h"
#include "formats/input_format.h"
#include "formats/rank_file_names.h"

namespace ckpt::fsdp_ranks {
namespace {

// Recognised by the names of its files only, so below every format with a
// marker of its own (a DCP or DeepSpeed folder may hold *rank* files too).
int probe_dir(const std::string& dir) { return list_rank_files(dir).empty() ? confidence::kNo : confidence::kNames; }

CheckpointModel read(const std::string& src, const ReadOptions& options) {
  if (!options.files.empty())
    return read_fsdp_rank_files(
        options.files, options.files.front() + " (and " + std::to_string(options.files.size() - 1) + " more files)",
        options.only, options.problems, options.param_layout, options.param_layout_model);
  return read_fsdp_ranks(src, options.only, options.problems, options.param_layout, options.param_layout_model);
}

}  // namespace

const InputFormat& input_format() {
  static const InputFormat f{.kind = SourceKind::kFsdpRanks,
                             .probe_directory = probe_dir,
                             .read = read,
                             .traits = {.sharded_layout = true, .reader_selects_only = true, .per_rank_files = true},
                             .directory_shape = "per-rank *rank{r}*.pt files",
                             .description =
                                 "per-rank FSDP files named *rank{r}*.pt: a directory, a quoted glob, or "
                                 "--files (FSDP1 flat parameters with --param-layout)"};
  return f;
}

}  // namespace ckpt::fsdp_ranks
