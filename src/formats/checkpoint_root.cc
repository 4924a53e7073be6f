#include "formats/checkpoint_root.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/linear_regex.h"
#include "core/units.h"
#include "formats/dcp/dcp_reader.h"
#include "formats/ds_universal/ds_universal_reader.h"
#include "formats/latest_file.h"
#include "formats/megatron_legacy/legacy_reader.h"
#include "formats/probe.h"
#include "formats/zero/stage0.h"
#include "formats/zero/zero_reader.h"
#include "io/containment.h"
#include "io/storage.h"

namespace ckpt {
namespace fs = std::filesystem;

namespace {

std::optional<int64_t> last_number(const std::string& name) {
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  std::optional<int64_t> out;
  for (std::size_t at = 0; at < name.size();) {  // each run of digits
    if (!is_digit(name[at])) {
      ++at;
      continue;
    }
    std::size_t end = at;
    while (end < name.size() && is_digit(name[end])) ++end;
    const std::string digits = name.substr(at, end - at);
    if (digits.size() < 19) out = std::stoll(digits);
    at = end;
  }
  return out;
}

// The largest rank + 1 named by `__<rank>_0.distcp` files in `dir`.
int distcp_world_size(const fs::path& dir) {
  static const LinearRegex kDistcp = LinearRegex::compile(R"(__(\d+)_\d+\.distcp)");
  int ws = -1;
  for (const DirEntry& e : list_directory(dir.string())) {
    RegexMatch m;
    const std::string& name = e.name;
    if (kDistcp.match(name, m) && m.length(1) < 6) ws = std::max(ws, std::stoi(m.str(1)) + 1);
  }
  return ws;
}

bool holds_distcp(const fs::path& dir) { return distcp_world_size(dir) > 0; }

// One subdirectory as a root entry; nullopt when it is no checkpoint, not
// even an unfinished one.
std::optional<RootEntry> entry_of(const fs::path& dir) {
  RootEntry e;
  e.name = dir.filename().string();
  e.path = dir.string();
  e.step = last_number(e.name);
  if (ds_universal::is_universal_tag(e.path) ||
      (zero::holds_zero_files(e.path) && is_directory((dir / "zero").string()))) {
    // A DeepSpeed universal tag (model states beside zero/): complete with
    // zero/optimizer_state.pt; it loads at any world size (-1).
    e.kind = source_format_name(SourceKind::kDsUniversal);
    e.complete = ds_universal::is_universal_tag(e.path);
  } else if (zero::holds_zero_files(e.path)) {
    // A DeepSpeed tag: its file names say whether every rank's are there; a
    // tag without ZeRO has the names of a ZeRO save that died before its
    // optimizer files, and its model-states file says which it is.
    e.kind = source_format_name(SourceKind::kZero);
    std::optional<int> ws = zero::tag_world_size(e.path);
    if (!ws) ws = zero::stage0_world_size(e.path);
    e.complete = ws.has_value();
    e.world_size = ws.value_or(-1);
  } else if (auto kind = directory_kind(e.path)) {
    e.kind = source_format_name(*kind);
    e.complete = true;
    e.world_size = *kind == SourceKind::kMegatronLegacy
                       ? megatron_legacy::rank_folder_count(e.path)
                       : distcp_world_size(*kind == SourceKind::kDcpPair ? dir / dcp_pair_model_dir : dir);
  } else if (holds_distcp(dir)) {  // a DCP save that never wrote .metadata
    e.kind = "dcp";
    e.world_size = distcp_world_size(dir);
  } else if (is_directory((dir / dcp_pair_model_dir).string())) {  // Accelerate, its model save unfinished
    e.kind = source_format_name(SourceKind::kDcpPair);
    e.world_size = distcp_world_size(dir / dcp_pair_model_dir);
  } else {
    return std::nullopt;
  }
  return e;
}

std::string listing(const std::string& dir, const std::vector<RootEntry>& entries) {
  std::string names;
  for (const auto& e : entries) names += (names.empty() ? "" : ", ") + e.name + (e.complete ? "" : " (incomplete)");
  return dir + " holds " + std::to_string(entries.size()) + " checkpoints: " + names;
}

// The tag a pointer file (`latest`, `latest_universal`) of `root` names;
// nullopt when there is no such file or it names no tag (a malformed one is
// reported where it is read).
std::optional<std::string> pointer_tag(const fs::path& root, const char* pointer) {
  try {
    return read_latest_tag(root / pointer);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// A DeepSpeed root: no tag itself, and its `latest` names a folder of
// DeepSpeed files (a ZeRO tag, finished or not, or a universal tag), or its
// `latest_universal` names a universal tag.
bool is_deepspeed_pointer_root(const std::string& dir) {
  if (zero::holds_zero_files(dir)) return false;
  const fs::path root(dir);
  std::optional<std::string> latest = pointer_tag(root, "latest");
  std::optional<std::string> universal = pointer_tag(root, "latest_universal");
  return (latest && zero::holds_zero_files((root / *latest).string())) ||
         (universal && ds_universal::is_universal_tag((root / *universal).string()));
}

// The highest-numbered complete checkpoint of `entries` (list_checkpoints
// sorts them by step); null when none is complete and numbered.
const RootEntry* highest_complete_entry(const std::vector<RootEntry>& entries) {
  const RootEntry* best = nullptr;
  for (const auto& e : entries)
    if (e.complete && e.step) best = &e;  // sorted by step: the last one wins
  return best;
}

// `--tag latest` where there is no `latest` file.
ChosenCheckpoint highest_complete(const std::string& src, const std::vector<RootEntry>& entries) {
  const RootEntry* best = highest_complete_entry(entries);
  if (!best) fail(ErrorCode::kNotFound, listing(src, entries) + "; none is complete and numbered: give --tag NAME");
  return {best->path, "--tag latest: the highest-numbered complete checkpoint (there is no `latest` file)"};
}

void require_tag_name(const std::string& src, const std::string& name) {
  if (name.find('/') != std::string::npos || name == "." || name == "..")
    fail_invalid("--tag '" + name + "' must name a checkpoint directly inside " + src);
}

// SRC a DeepSpeed root: the tag folder to read (ZeRO or universal), by the
// rule of checkpoint_root.h. Only the chosen folder is looked at, as
// DeepSpeed's loader does; the folder is listed only to say what it holds.
ChosenCheckpoint choose_deepspeed_tag(const std::string& src, const std::string& tag) {
  const fs::path root(src);
  std::string name, why, pointer;
  if (tag.empty() || tag == "latest") {
    if (std::optional<std::string> named = read_latest_tag(root / "latest")) {
      name = *named;
      pointer = "latest";
      why = tag.empty() ? "the tag `latest` names" : "--tag latest: the tag `latest` names";
      std::optional<std::string> universal = pointer_tag(root, "latest_universal");
      if (tag.empty() && universal && *universal != name)
        why += "; `latest_universal` names " + *universal + ", read with --tag latest_universal";
    } else if (tag.empty()) {
      name = read_latest_tag(root / "latest_universal").value_or("");
      pointer = "latest_universal";
      why = "the tag `latest_universal` names (there is no `latest`)";
    } else {
      return highest_complete(src, list_checkpoints(src));
    }
  } else if (tag == "latest_universal" && is_regular_file((root / "latest_universal").string())) {
    name = read_latest_tag(root / "latest_universal").value_or("");
    pointer = "latest_universal";
    why = "--tag latest_universal: the tag `latest_universal` names";
  } else {
    require_tag_name(src, tag);
    name = tag;
    why = "--tag " + tag;
  }
  const fs::path dir = root / name;
  if (!is_directory(dir.string())) {
    if (!pointer.empty())
      fail(ErrorCode::kNotFound, src + ": `" + pointer + "` names tag '" + name + "', which is not a directory here");
    fail(ErrorCode::kNotFound, src + ": no tag directory '" + name + "'; " + listing(src, list_checkpoints(src)));
  }
  require_inside(dir.string(), src);
  std::optional<RootEntry> e = entry_of(dir);
  if (!e) fail(ErrorCode::kNotFound, dir.string() + " (" + why + ") holds no checkpoint");
  // A ZeRO tag with a rank's files missing is read: its reader names them.
  if (!e->complete && e->kind != source_format_name(SourceKind::kZero))
    fail_data_loss(e->path + ": this checkpoint is incomplete (its save never finished); choose another with --tag");
  return {dir.string(), why};
}

// A Megatron-LM legacy root read with no --tag or --tag latest: the
// iteration its tracker (latest_checkpointed_iteration.txt) names, as
// Megatron-LM's load_checkpoint reads it; nullopt when there is no tracker
// or --tag names a folder.
std::optional<ChosenCheckpoint> megatron_tracked(const std::string& src, const std::string& tag,
                                                 const std::vector<RootEntry>& entries) {
  if (!tag.empty() && tag != "latest") return std::nullopt;
  std::optional<std::string> name = megatron_legacy::tracker_folder(src);
  if (!name) return std::nullopt;
  const std::string tracker = (fs::path(src) / megatron_legacy::kTrackerFile).string();
  for (const auto& e : entries)
    if (e.name == *name)
      return ChosenCheckpoint{e.path, (tag.empty() ? "no --tag: " : "--tag latest: ") + std::string("the iteration ") +
                                          tracker + " names; --tag NAME reads another"};
  fail(ErrorCode::kNotFound, tracker + " names '" + *name + "', which is no checkpoint here; " + listing(src, entries));
}

}  // namespace

std::vector<RootEntry> list_checkpoints(const std::string& dir) {
  std::vector<RootEntry> out;
  if (!is_directory(dir)) return out;
  for (const DirEntry& sub : list_directory(dir))
    if (sub.is_directory()) {
      const fs::path path = fs::path(dir) / sub.name;
      // A step directory that is a link out of the folder (`step-9 ->
      // ../secret`) would be read as one of its checkpoints: Unsafe unless
      // --follow-links.
      require_inside(path.string(), dir);
      if (auto e = entry_of(path)) out.push_back(std::move(*e));
    }
  std::sort(out.begin(), out.end(), [](const RootEntry& a, const RootEntry& b) {
    return a.step != b.step ? a.step.value_or(-1) < b.step.value_or(-1) : a.name < b.name;
  });
  if (!out.empty()) {
    try {  // a malformed `latest` marks nothing; choose_checkpoint refuses it where it is what chooses
      if (auto latest = read_latest_tag(fs::path(dir) / "latest"))
        for (auto& e : out) e.latest = e.latest || e.name == *latest;
    } catch (const Error&) {
    }
    if (auto universal = pointer_tag(fs::path(dir), "latest_universal"))
      for (auto& e : out) e.latest_universal = e.name == *universal;
    try {  // a Megatron-LM tracker names the iteration a resuming job loads (a malformed one: see choose_checkpoint)
      if (auto tracked = megatron_legacy::tracker_folder(dir))
        for (auto& e : out) e.latest = e.latest || e.name == *tracked;
    } catch (const Error&) {
    }
  }
  return out;
}

std::optional<UnfinishedSave> unfinished_save(const std::string& dir) {
  if (!is_directory(dir)) return std::nullopt;
  std::optional<RootEntry> e = entry_of(fs::path(dir));
  if (!e || e->complete) return std::nullopt;
  if (e->kind == source_format_name(SourceKind::kZero))
    return UnfinishedSave{e->kind, dir +
                                       " is a DeepSpeed tag whose save did not finish: a rank's optimizer or "
                                       "model-states file is missing"};
  if (e->kind == source_format_name(SourceKind::kDsUniversal))
    return UnfinishedSave{e->kind, dir +
                                       " is a DeepSpeed universal tag whose save did not finish: its "
                                       "zero/optimizer_state.pt or model-states file is missing"};
  return UnfinishedSave{e->kind, dir + " is a " + e->kind +
                                     " checkpoint whose save did not finish: its .distcp "
                                     "files are there, its .metadata (written last) is not"};
}

bool is_checkpoint_root(const std::string& src) {
  if (!is_directory(src) || directory_kind(src)) return false;
  return !list_checkpoints(src).empty();
}

ChosenCheckpoint choose_checkpoint(const std::string& src, const std::string& tag) {
  if (!is_directory(src)) {
    if (!tag.empty() && stat_path(src).kind != EntryKind::kNone)
      fail_invalid("--tag " + tag + ": " + src + " is one checkpoint file, not a folder of checkpoints; drop --tag");
    return {src, ""};
  }
  if (is_deepspeed_pointer_root(src)) return choose_deepspeed_tag(src, tag);
  if (directory_kind(src)) {
    if (!tag.empty())
      fail_invalid("--tag " + tag + ": " + src + " is one checkpoint, not a folder of checkpoints; drop --tag");
    return {src, ""};
  }
  std::vector<RootEntry> entries = list_checkpoints(src);
  if (entries.empty()) return {src, ""};  // detect_source names what is missing
  if (std::optional<ChosenCheckpoint> tracked = megatron_tracked(src, tag, entries)) return *tracked;
  if (tag.empty()) {
    // A `latest` file decides even when one checkpoint is there: one naming
    // a tag that is gone (a save deleted, a BOM before the name) is what a
    // resuming DeepSpeed job fails on, not a reason to read another step.
    if (!is_regular_file((fs::path(src) / "latest").string())) {
      if (entries.size() == 1 && entries[0].complete) return {entries[0].path, "the only checkpoint in " + src};
      // A run's folder of steps: the latest, as a job resuming from it reads
      // (torchtitan, Accelerate, Lightning load the last one), said in a note.
      const RootEntry* best = highest_complete_entry(entries);
      if (!best) fail_invalid(listing(src, entries) + "; none is complete and numbered: choose one with --tag NAME");
      std::string why =
          "no --tag: the highest-numbered complete of the " + std::to_string(entries.size()) + " checkpoints in " + src;
      if (const RootEntry& last = entries.back(); &last != best && !last.complete)
        why += " (" + last.name + " is incomplete: its save did not finish)";
      return {best->path, why + "; --tag NAME reads another"};
    }
  }
  // `asked` is how a message names what chose the checkpoint.
  std::string name = tag, why = "--tag " + tag, asked = "--tag " + tag;
  if (tag.empty() || tag == "latest") {
    if (!is_regular_file((fs::path(src) / "latest").string())) return highest_complete(src, entries);
    name = *read_latest_tag(fs::path(src) / "latest");
    asked = tag.empty() ? "no --tag" : "--tag latest";
    why = tag.empty() ? "no --tag: the checkpoint the file `latest` names; --tag NAME reads another"
                      : "--tag latest: the tag `latest` names";
  }
  require_tag_name(src, name);
  for (const auto& e : entries)
    if (e.name == name) {
      if (!e.complete)
        fail_data_loss(e.path + ": this checkpoint is incomplete (its save never wrote its metadata); " +
                       "choose another with --tag");
      return {e.path, why};
    }
  if (name != tag)
    fail(ErrorCode::kNotFound, asked + ": " + (fs::path(src) / "latest").string() + " names '" + name +
                                   "', which is no checkpoint here; " + listing(src, entries));
  fail(ErrorCode::kNotFound, "--tag " + name + ": no such checkpoint; " + listing(src, entries));
}

std::string resolve_checkpoint(const std::string& src, const std::string& tag) {
  return choose_checkpoint(src, tag).path;
}

uint64_t directory_bytes(const std::string& dir) {
  // Files (through links) count; folders are entered unless they are links.
  uint64_t total = 0;
  for (const DirEntry& e : list_directory(dir)) {
    if (e.is_file())
      total += stat_path(e.path).size;
    else if (e.is_directory() && !e.link)
      total += directory_bytes(e.path);
  }
  return total;
}

std::string describe_root(const std::string& dir, const std::vector<RootEntry>& entries) {
  std::string out = dir + ": a folder of " + std::to_string(entries.size()) +
                    (entries.size() == 1 ? " checkpoint" : " checkpoints") +
                    " (read one with --tag NAME or --tag latest)\n";
  std::size_t width = 4;
  for (const auto& e : entries) width = std::max(width, e.name.size());
  for (const auto& e : entries) {
    std::string line = "  " + e.name + std::string(width - e.name.size() + 2, ' ');
    const bool universal = e.kind == source_format_name(SourceKind::kDsUniversal);
    line += "step " + (e.step ? std::to_string(*e.step) : std::string("?")) + "  " + e.kind + "  world size " +
            (e.world_size > 0 ? std::to_string(e.world_size) : std::string(universal ? "any" : "?")) + "  " +
            human_bytes(static_cast<double>(directory_bytes(e.path))) + "  " +
            (e.complete                                        ? "complete"
             : e.kind == source_format_name(SourceKind::kZero) ? "INCOMPLETE (a rank's files are missing)"
             : universal                                       ? "INCOMPLETE (no zero/optimizer_state.pt)"
                                                               : "INCOMPLETE (no metadata)") +
            (e.latest ? "  <- latest" : "") + (e.latest_universal ? "  <- latest_universal" : "");
    out += line + "\n";
  }
  return out;
}

}  // namespace ckpt
