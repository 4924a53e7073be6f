#include "formats/detect.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "formats/checkpoint_root.h"
#include "formats/fsdp_ranks/rank_file_names.h"
#include "formats/registry.h"
#include "formats/zero/zero_reader.h"
#include "io/containment.h"
#include "model/plain_values.h"

namespace ckpt {
namespace fs = std::filesystem;

namespace {

// One rank's file of a DeepSpeed tag or of a per-rank family: read alone it
// is a part, and would consolidate to a wrong whole (a ZeRO model-states
// file: its bf16 weights, exit 0). Refused, except for inspect, which shows
// the file as what it is, with a warning.
void check_not_one_rank_alone(const std::string& src, bool allowed) {
  std::error_code ec;
  if (fs::is_directory(src, ec) || !fs::exists(src, ec)) return;
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

}  // namespace

namespace {

// The registered format whose probe answers highest for `probe`, or null
// when none recognises the source. On a tie the first registered wins.
template <typename Probe>
const InputFormat* best_format(Probe probe) {
  const InputFormat* best = nullptr;
  int best_confidence = confidence::kNo;
  for (const InputFormat* f : input_formats()) {
    int c = probe(*f);
    if (c > best_confidence) {
      best = f;
      best_confidence = c;
    }
  }
  return best;
}

const InputFormat* directory_format(const std::string& dir) {
  return best_format([&](const InputFormat& f) { return f.probe_directory ? f.probe_directory(dir) : 0; });
}

// "no DCP .metadata, no DeepSpeed `latest` or *_model_states.pt, ...": what
// each directory format would have shown.
std::string directory_shapes() {
  std::string out;
  for (const InputFormat* f : input_formats())
    if (!f->directory_shape.empty())
      out += std::string(out.empty() ? "no " : ", no ") + std::string(f->directory_shape);
  return out;
}

// "torch.save file, safetensors file, ...": the kinds a single file may be.
std::string file_kinds() {
  std::string out;
  for (const InputFormat* f : input_formats())
    if (f->probe_file) out += std::string(out.empty() ? "" : ", ") + source_kind_name(f->kind);
  return out;
}

}  // namespace

std::optional<SourceKind> directory_kind(const std::string& dir) {
  if (const InputFormat* f = directory_format(dir)) return f->kind;
  return std::nullopt;
}

SourceKind detect_source(const std::string& src) {
  std::error_code ec;
  auto status = fs::status(src, ec);
  if ((ec || !fs::exists(status)) && fsdp_ranks::is_glob_pattern(src)) return SourceKind::kFsdpRanks;
  if (ec || !fs::exists(status)) fail(ErrorCode::kNotFound, src + ": no such file or directory");
  if (fs::is_directory(status)) {
    if (auto kind = directory_kind(src)) return *kind;
    if (fs::is_empty(src, ec)) fail(ErrorCode::kNotFound, "no checkpoint found in " + src + ": the directory is empty");
    fail(ErrorCode::kUnimplemented, src + ": directory is not a recognised checkpoint (" + directory_shapes() +
                                        ") and holds no checkpoint directories");
  }
  // One file of a DCP directory read alone is no checkpoint: its .distcp
  // holds bytes without their tensors' shapes, its .metadata no bytes.
  fs::path file(src);
  fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  bool dcp_member = file.filename() == ".metadata" || file.extension() == ".distcp";
  if (dcp_member && directory_kind(dir.string()) == SourceKind::kDcpDir)
    fail_invalid(src + " is one file of the DCP checkpoint " + dir.string() + ": pass the directory");
  SourcePtr source = open_file_source(src);
  auto probe = [&](const InputFormat& f) { return f.probe_file ? f.probe_file(src, *source) : 0; };
  if (const InputFormat* format = best_format(probe)) return format->kind;
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
    std::error_code ec;
    std::string parent = std::filesystem::path(given).parent_path().string();
    add_checkpoint_root(std::filesystem::is_directory(given, ec) ? given : parent.empty() ? "." : parent);
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
