#include "formats/detect.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "formats/checkpoint_root.h"
#include "formats/probe.h"
#include "formats/rank_file_names.h"
#include "formats/registry.h"
#include "formats/zero/zero_reader.h"
#include "io/containment.h"
#include "io/storage.h"
#include "model/plain_values.h"

namespace ckpt {
namespace fs = std::filesystem;

namespace {

// One rank's file of a DeepSpeed tag or of a per-rank family: read alone it
// is a part, and would consolidate to a wrong whole (a ZeRO model-states
// file: its bf16 weights, exit 0). Refused, except for inspect, which shows
// the file as what it is, with a warning.
void check_not_one_rank_alone(const std::string& src, bool allowed) {
  const EntryStat st = stat_path(src);
  if (st.is_directory() || st.kind == EntryKind::kNone) return;
  fs::path file(src);
  fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::string part_of;
  const std::string name = file.filename().string();
  if ((name.ends_with("_model_states.pt") || name.ends_with("_optim_states.pt")) &&
      zero::is_zero_checkpoint(dir.string()))
    part_of = " is one file of the DeepSpeed ZeRO checkpoint " + dir.string() +
              ": pass the directory (or the folder holding `latest`)";
  std::optional<fsdp_ranks::RankFileName> rank_name;
  std::vector<std::pair<std::string, fsdp_ranks::RankFileName>> siblings;
  if (part_of.empty() && file.has_extension()) {
    siblings = fsdp_ranks::name_rank_files(fsdp_ranks::list_rank_files(dir.string()));
    for (const auto& [path, n] : siblings)
      if (fs::path(path).filename() == file.filename() && !n.auxiliary) rank_name = n;
  }
  if (rank_name) {
    std::size_t family = 0;
    for (const auto& [path, other] : siblings)
      if (other.tmpl == rank_name->tmpl) ++family;
    if (family > 1)
      part_of = " is rank " + std::to_string(rank_name->rank) + " of the per-rank checkpoint " + dir.string() + " (" +
                std::to_string(family) + " files " + rank_name->tmpl +
                "): pass the directory, or --files to choose the files to read";
  }
  if (part_of.empty()) return;
  if (!allowed) fail_invalid(src + part_of);
  log::warn(src + part_of + "; showing this file alone");
}

// A folder one level above what the user meant (a run folder holding
// `ckpt/`, a Megatron-LM or DeepSpeed root): names the subfolders that are
// checkpoints or folders of them, so the message says where to point. Links
// are not followed (a hint must not read outside the folder).
std::string nested_checkpoints_hint(const std::string& dir) {
  constexpr std::size_t kMaxNamed = 4;
  std::vector<std::string> found;
  std::size_t more = 0;
  for (const DirEntry& sub : list_directory(dir)) {
    if (!sub.is_directory() || sub.link) continue;
    const std::string& path = sub.path;
    bool is_one = false;
    try {
      is_one = directory_kind(path).has_value() || is_checkpoint_root(path);
    } catch (const Error&) {  // an unreadable subfolder is not a hint
    }
    if (!is_one) continue;
    if (found.size() < kMaxNamed)
      found.push_back(path);
    else
      ++more;
  }
  if (found.empty()) return "";
  std::string names;
  for (const auto& f : found) names += (names.empty() ? "" : ", ") + f;
  if (more) names += " and " + std::to_string(more) + " more";
  const bool several = found.size() + more > 1;
  return std::string("; its subfolder") + (several ? "s " : " ") + names +
         (several ? " hold checkpoints" : " holds one") + ": pass " + (several ? "one of them" : "it") + " instead";
}

}  // namespace

SourceKind detect_source(const std::string& src) {
  const EntryStat st = stat_path(src);  // links followed: a dangling one is no source
  if (st.kind == EntryKind::kNone && fsdp_ranks::is_glob_pattern(src)) return SourceKind::kFsdpRanks;
  if (st.kind == EntryKind::kNone) fail(ErrorCode::kNotFound, src + ": no such file or directory");
  if (st.is_directory()) {
    if (auto kind = directory_kind(src)) return *kind;
    if (list_directory(src).empty())
      fail(ErrorCode::kNotFound, "no checkpoint found in " + src + ": the directory is empty");
    fail(ErrorCode::kUnimplemented, src + ": directory is not a recognised checkpoint (" + directory_shapes() +
                                        ") and holds no checkpoint directories" + nested_checkpoints_hint(src));
  }
  // One file of a DCP directory read alone is no checkpoint: its .distcp
  // holds bytes without their tensors' shapes, its .metadata no bytes.
  fs::path file(src);
  fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  bool dcp_member = file.filename() == ".metadata" || file.extension() == ".distcp";
  if (dcp_member && directory_kind(dir.string()) == SourceKind::kDcpDir)
    fail_invalid(src + " is one file of the DCP checkpoint " + dir.string() + ": pass the directory");
  SourcePtr source = open_file_source(src);
  if (std::optional<SourceKind> kind = file_kind(src, *source)) return *kind;
  fail_data_loss(src + ": not a recognised checkpoint file (expected one of: " + file_kinds() + ")");
}

namespace {

// What every kind of source has: its kind, its files and, for a single
// file, world size 1. Readers of sharded sources fill in the rest.
void complete_info(CheckpointModel& model, const std::string& src, SourceKind kind) {
  SourceInfo& info = model.info;
  info.kind = kind;
  if (info.files.empty()) info.files.push_back(src);
  if (info.world_sizes.empty() && !info.is_sharded_source()) info.world_sizes = {1};
}

}  // namespace

namespace {

// The kind of `src` once a folder of checkpoints is resolved to one.
SourceKind kind_of_resolved(const std::string& src, const ReadOptions& options) {
  if (!options.files.empty()) return SourceKind::kFsdpRanks;
  if (src.empty()) fail_invalid("no checkpoint given: SRC or --files is required");
  check_not_one_rank_alone(src, options.one_rank_alone);
  return detect_source(src);
}

}  // namespace

SourceKind source_kind_of(const std::string& src, const ReadOptions& options) {
  return kind_of_resolved(options.files.empty() ? resolve_checkpoint(src, options.tag) : src, options);
}

CheckpointModel read_checkpoint(const std::string& given, const ReadOptions& options) {
  // A folder of checkpoints: the one --tag chose, resolved once.
  const ChosenCheckpoint chosen =
      options.files.empty() ? choose_checkpoint(given, options.tag) : ChosenCheckpoint{given, ""};
  const std::string& src = chosen.path;
  // Every file read from here on that is named through the checkpoint's
  // folder must lie in it (io/containment.h); the paths given are trusted.
  if (options.files.empty()) {
    trust_given_path(given);
    std::string parent = parent_dir(given);
    add_checkpoint_root(is_directory(given) ? given : parent.empty() ? "." : parent);
  } else {
    for (const auto& f : options.files) trust_given_path(f);
  }
  SourceKind kind = kind_of_resolved(src, options);
  if (!options.files.empty() && !src.empty()) fail_invalid("give either SRC or --files, not both");
  if (!options.files.empty() && !options.tag.empty())
    fail_invalid("--tag " + options.tag + ": --files names the files to read; drop --tag");
  // The run's first line names what is read and why, so a wrong choice shows.
  if (!chosen.why.empty()) log::info("reading " + src + " (" + source_format_name(kind) + ", " + chosen.why + ")");
  ReadOptions read = options;
  read.tag.clear();  // chosen above: the reader gets the checkpoint itself
  // --param-layout is another checkpoint, read here (the layer that reads
  // sources) when the reader asks for it: no reader reads one itself.
  if (!read.param_layout.empty() && !read.param_layout_model)
    read.param_layout_model = [path = read.param_layout] { return read_checkpoint(path, {}); };
  CheckpointModel model = input_format(kind).read(src, read);
  complete_info(model, src, kind);
  if (model.root) {
    with_context(model.source, [&] {
      require_plain_values(*model.root);
      require_bounded_expansion(*model.root);
    });
  }
  return model;
}

}  // namespace ckpt
