#include "jobs/output_folder.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "formats/safetensors/safetensors_reader.h"
#include "io/byte_sink.h"
#include "io/byte_source.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"
#include "io/storage.h"
#include "model/ordered_json.h"

namespace ckpt::jobs {
namespace {

namespace fs = std::filesystem;

// Side files larger than this are left out (a tokenizer.json is tens of MB;
// anything far larger beside the weights is not a config).
constexpr uintmax_t kMaxSideFile = 256ull << 20;

bool exists_no_follow(const fs::path& p) { return stat_path(p.string()).exists(); }

// Copies `from` to `to` through an atomic sink (fsynced when durable).
void copy_file_to(const fs::path& from, const fs::path& to, bool durable) {
  auto source = open_file_source(from.string());
  auto sink = AtomicFileSink::create(to.string(), false, durable);
  sink->copy_from(*source, 0, source->size());
  sink->finish();
}

// config.json as it must read beside the weights written: its dtype keys
// set to `cast_to` (when given), as transformers writes a config
// (json.dumps(indent=2, sort_keys=True) + "\n"), and its
// `transformers_weights` (the file from_pretrained reads instead of
// model.safetensors) naming `weights_name`, the file written (a source's
// config may name its own, e.g. consolidated.safetensors, which is not in
// this folder). nullopt when nothing changes or it is not a JSON object
// (then it is copied unchanged, byte for byte).
std::optional<std::string> config_for_output(const fs::path& from, const ConfigEdits& edits) {
  auto source = open_file_source(from.string());
  std::string text(source->size(), '\0');
  source->read(0, text.data(), text.size());
  nlohmann::json config;
  try {
    config = nlohmann::json(parse_checkpoint_json(text, from.string()));
  } catch (const Error&) {
    return std::nullopt;
  }
  if (!config.is_object()) return std::nullopt;
  bool changed = false;
  if (edits.dtype)
    for (const char* key : {"torch_dtype", "dtype"})
      if (auto it = config.find(key); it != config.end() && it->is_string() && *it != dtype_name(*edits.dtype)) {
        *it = std::string(dtype_name(*edits.dtype));
        changed = true;
      }
  if (auto it = config.find("transformers_weights"); it != config.end() && *it != edits.weights_name) {
    log::info(from.string() + ": transformers_weights " + printable_text(it->dump()) + " set to the file written, " +
              edits.weights_name);
    *it = edits.weights_name;
    changed = true;
  }
  if (!changed) return std::nullopt;
  return config.dump(2, ' ', true) + "\n";
}

// `from` (an entry of the folder being replaced) into `to`: files as hard
// links (a copy where a link is refused: another file system below DIR),
// symlinks as symlinks, folders entry by entry.
void carry(const fs::path& from, const fs::path& to) {
  const Storage& storage = storage_for(from.string());
  EntryStat st = storage.stat(from.string());
  if (st.link) {
    storage.copy_link(from.string(), to.string());
  } else if (st.is_directory()) {
    storage.make_directory(to.string());
    for (const DirEntry& e : storage.list(from.string())) carry(e.path, to / e.name);
  } else if (st.is_file()) {
    storage.link_or_copy(from.string(), to.string());
  } else {
    log::warn(from.string() + ": not a file, folder or link; not carried into the new folder");
  }
}

}  // namespace

CreatedDirectories::CreatedDirectories(const std::string& dir) {
  fs::path path = fs::path(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  std::vector<std::string> wanted;  // outermost first
  for (fs::path p = path; !p.empty() && !stat_path(p.string()).resolves(); p = p.parent_path())
    wanted.insert(wanted.begin(), p.string());
  if (!wanted.empty()) {
    const std::string above = parent_dir(wanted.front());
    if (!is_directory(above.empty() ? "." : above))
      fail(ErrorCode::kOutputFailed, dir + ": " + above + " is not a directory");
  }
  for (const auto& p : wanted)  // one by one, so that a failure part way removes what was made
    if (storage_for(p).make_directory(p)) made_.push_back(p);  // false: a sibling made it
}

CreatedDirectories CreatedDirectories::parents_of(const std::string& path) {
  if (is_s3_url(path)) return CreatedDirectories();  // keys need no folders
  const fs::path parent = fs::path(without_trailing_slashes(path)).parent_path();
  return parent.empty() ? CreatedDirectories() : CreatedDirectories(parent.string());
}

CreatedDirectories::CreatedDirectories(CreatedDirectories&& other) noexcept : made_(std::move(other.made_)) {
  other.made_.clear();
}

CreatedDirectories& CreatedDirectories::operator=(CreatedDirectories&& other) noexcept {
  std::swap(made_, other.made_);
  return *this;
}

CreatedDirectories::~CreatedDirectories() {
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) storage_for(*it).remove(*it);  // only if empty
}

std::vector<std::string> side_files_with_config_from(const std::string& dir2,
                                                     const std::vector<std::string>& side_files) {
  if (!is_directory(dir2)) fail_invalid("--config-from " + dir2 + ": not a directory");
  std::vector<std::string> out;
  std::set<std::string> names;
  for (const DirEntry& e : list_directory(dir2))
    if (e.is_file() && !safetensors::is_weights_file_name(e.name) && e.name != "adapter_config.json") {
      out.push_back(e.path);
      names.insert(e.name);
    }
  if (!names.count("config.json"))
    log::warn("--config-from " + dir2 + ": no config.json there; from_pretrained needs one");
  for (const auto& f : side_files)
    if (!names.count(fs::path(f).filename().string())) out.push_back(f);
  return out;
}

std::vector<std::string> file_family_in(const std::string& dir, const std::string& file) {
  fs::path f(file);
  std::string stem = f.stem().string(), ext = f.extension().string();
  // STEM-NNNNN-of-NNNNNEXT, as a sharded output names its files.
  auto is_shard = [&](const std::string& name) {
    auto digits = [&](std::size_t at) {
      for (std::size_t i = at; i < at + 5; ++i)
        if (name[i] < '0' || name[i] > '9') return false;
      return true;
    };
    const std::size_t at = stem.size();
    return name.size() == at + 15 + ext.size() && name.compare(0, at, stem) == 0 && name[at] == '-' && digits(at + 1) &&
           name.compare(at + 6, 4, "-of-") == 0 && digits(at + 10) && name.compare(at + 15, ext.size(), ext) == 0;
  };
  std::vector<std::string> out;
  for (const DirEntry& e : list_directory(dir))
    if (e.name == file || e.name == file + ".index.json" || is_shard(e.name)) out.push_back(e.name);
  return out;
}

std::vector<std::string> publish_side_objects(const std::string& dir, const std::vector<std::string>& side_files,
                                              const ConfigEdits& config_edits, bool replacing) {
  std::vector<std::string> ordered = side_files;
  std::stable_partition(ordered.begin(), ordered.end(),
                        [](const std::string& f) { return fs::path(f).filename() != "config.json"; });
  std::set<std::string> existing;  // one listing, not a request per file
  for (const DirEntry& e : list_directory(dir))
    if (e.is_file()) existing.insert(e.name);
  std::vector<std::string> put;
  try {
    for (const auto& side : ordered) {
      const std::string to = without_trailing_slashes(dir) + "/" + fs::path(side).filename().string();
      if (EntryStat st = stat_path(side); !st.is_file() || st.size > kMaxSideFile) {
        log::warn(side + ": not copied into " + dir + " (" + (st.is_file() ? "larger than 256 MiB" : "not a file") +
                  ")");
        continue;
      }
      const bool is_config = fs::path(side).filename() == "config.json";
      const bool there = existing.count(fs::path(side).filename().string()) > 0;
      if (there && !replacing) {
        log::info(to + " is there already: kept as it is (not the source's)");
        // Kept, but it must say the dtype the weights beside it have, and name them.
        if (std::optional<std::string> recast = is_config ? config_for_output(to, config_edits) : std::nullopt)
          s3_put_object(to, *recast, true);
        continue;
      }
      std::optional<std::string> bytes;
      if (is_config) bytes = config_for_output(side, config_edits);
      if (!bytes) bytes = read_small_file(side, kMaxSideFile);
      s3_put_object(to, *bytes, there);
      if (!there) put.push_back(to);  // one put over an old object is not deleted on failure: the old bytes are gone
    }
  } catch (const Error&) {
    for (const auto& url : put) s3_delete_object(url);
    throw;
  }
  return put;
}

OutputFolder::OutputFolder(const std::string& dir, const std::string& file, bool force, bool durable)
    : dir_(without_trailing_slashes(dir)), file_(file), durable_(durable) {
  if (!stat_path(dir_).resolves()) {
    fs::path parent = fs::path(dir_).parent_path();
    if (!parent.empty()) parents_ = CreatedDirectories(parent.string());
    staging_ = std::make_unique<AtomicDirectory>(dir_, false, durable);
    return;
  }
  replaced_ = file_family_in(dir_, file_);
  if (replaced_.empty()) return;
  if (!force) fail_invalid(dir_ + "/" + replaced_.front() + ": output exists (use --force to overwrite)");
  staging_ = std::make_unique<AtomicDirectory>(dir_, true, durable);
}

std::string OutputFolder::file_path() const {
  return ((staging_ ? fs::path(staging_->temp_dir()) : fs::path(dir_)) / file_).string();
}

std::string OutputFolder::published_path(const std::string& path) const {
  return (fs::path(dir_) / fs::path(path).filename()).string();
}

void copy_folder_side_files(const std::string& into, const std::string& shown_dir,
                            const std::vector<std::string>& side_files, const ConfigEdits& config_edits, bool durable) {
  std::vector<std::string> ordered = side_files;
  std::stable_partition(ordered.begin(), ordered.end(),
                        [](const std::string& f) { return fs::path(f).filename() != "config.json"; });
  for (const auto& side : ordered) {
    fs::path to = fs::path(into) / fs::path(side).filename();
    const std::string shown = (fs::path(shown_dir) / to.filename()).string();
    if (exists_no_follow(to)) {
      log::info(shown + " is there already: kept as it is (not the source's)");
      // Kept, but it must say the dtype the weights beside it have, and name them.
      if (to.filename() == "config.json" && stat_path(to.string()).is_file() && !stat_path(to.string()).link)
        if (std::optional<std::string> recast = config_for_output(to, config_edits)) {
          auto sink = AtomicFileSink::create(to.string(), true, durable);
          sink->write(*recast);
          sink->finish();
          log::info(shown + (config_edits.dtype ? ": its dtype set to " + std::string(dtype_name(*config_edits.dtype)) +
                                                      ", the dtype written"
                                                : ": set to name the weights written"));
        }
      continue;
    }
    if (EntryStat st = stat_path(side); !st.is_file() || st.size > kMaxSideFile) {
      log::warn(side + ": not copied into " + shown_dir + " (" + (st.is_file() ? "larger than 256 MiB" : "not a file") +
                ")");
      continue;
    }
    std::optional<std::string> recast;
    if (to.filename() == "config.json") recast = config_for_output(side, config_edits);
    if (recast) {
      auto sink = AtomicFileSink::create(to.string(), false, durable);
      sink->write(*recast);
      sink->finish();
    } else {
      copy_file_to(side, to, durable);
    }
  }
}

void OutputFolder::publish(const std::vector<std::string>& side_files, const ConfigEdits& config_edits) {
  fs::path into = staging_ ? fs::path(staging_->temp_dir()) : fs::path(dir_);
  copy_folder_side_files(into.string(), dir_, side_files, config_edits, durable_);
  if (!staging_) return;
  if (!replaced_.empty())
    for (const DirEntry& e : list_directory(dir_)) {
      if (std::find(replaced_.begin(), replaced_.end(), e.name) == replaced_.end() && !exists_no_follow(into / e.name))
        carry(e.path, into / e.name);
    }
  staging_->commit();
  parents_.keep();
}

}  // namespace ckpt::jobs
