#include "exec/write_folders.h"

#include <utility>

#include "core/error.h"
#include "core/paths.h"
#include "exec/parted_output.h"
#include "exec/write_dcp.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"
#include "io/storage.h"

namespace ckpt {

namespace {

// A copied file up to this size is held in memory and put as one object;
// a larger one (an EMA model that register_for_checkpointing saved as
// custom_checkpoint_0.pkl) is streamed up in parts at publishing.
constexpr uint64_t kMaxHeldObject = kS3MinPartSize;

}  // namespace

FoldersWriter::FoldersWriter(std::string dir, std::vector<Folder> folders, std::vector<std::string> copied)
    : dir_(without_trailing_slashes(std::move(dir))), folders_(std::move(folders)), copied_(std::move(copied)) {
  for (const Folder& f : folders_) {
    const std::vector<std::string> dests = f.writer->destinations();
    if (dests.size() != 1 || dests[0] != dir_ + "/" + f.name)
      fail(ErrorCode::kInternal, "FoldersWriter: folder " + f.name + " is not written to " + dir_ + "/" + f.name);
  }
}

std::string FoldersWriter::kind() const {
  std::string out = "folders";
  for (const Folder& f : folders_) out += ":" + f.name + "=" + f.writer->kind();
  return out;
}

std::pair<std::size_t, std::size_t> FoldersWriter::locate(std::size_t k) const {
  for (std::size_t j = 0; j < folders_.size(); ++j) {
    const std::size_t n = folders_[j].writer->file_names().size();
    if (k < n) return {j, k};
    k -= n;
  }
  fail(ErrorCode::kInternal, "FoldersWriter: no file " + std::to_string(k));
}

std::vector<std::string> FoldersWriter::file_names() const {
  std::vector<std::string> out;
  for (const Folder& f : folders_)
    for (const std::string& name : f.writer->file_names()) out.push_back(f.name + "/" + name);
  return out;
}

std::string FoldersWriter::output_path(std::size_t k) const {
  auto [j, i] = locate(k);
  return folders_[j].writer->output_path(i);
}

// Folder after folder, each given its slice of the sinks; its units are
// renumbered into this writer's file order.
void FoldersWriter::run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) {
  std::size_t first = 0;
  for (Folder& f : folders_) {
    const std::size_t n = f.writer->file_names().size();
    std::vector<ByteSink*> mine(sinks.begin() + static_cast<std::ptrdiff_t>(first),
                                sinks.begin() + static_cast<std::ptrdiff_t>(first + n));
    f.writer->run(mine, [&](const PartUnit& unit, ByteSink& sink, archive::ZipWriter* zip) {
      PartUnit renumbered = unit;
      renumbered.file += first;
      emit(renumbered, sink, zip);
    });
    first += n;
  }
}

bool FoldersWriter::fills_files_in_order() const {
  for (const Folder& f : folders_)
    if (!f.writer->fills_files_in_order()) return false;
  return true;
}

Published FoldersWriter::publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) {
  const std::vector<MarkerFile> markers = folder_markers();
  Published out = publish_directory(dir_, file_names(), data_path, force, durable, [&](const std::string& temp) {
    for (const MarkerFile& m : markers) {
      auto sink = AtomicFileSink::create(temp + m.path.substr(dir_.size()), false, durable);
      sink->write(m.bytes);
      sink->finish();
    }
    copy_side_files(copied_, temp);  // streamed: no size limit on disk
  });
  return out;
}

bool FoldersWriter::publishes_to_object_store() const {
  for (const Folder& f : folders_)
    if (!f.writer->publishes_to_object_store()) return false;
  return true;
}

std::vector<MarkerFile> FoldersWriter::folder_markers() const {
  std::vector<MarkerFile> out;
  for (const Folder& f : folders_)
    for (MarkerFile& m : f.writer->marker_files()) out.push_back(std::move(m));
  return out;
}

std::vector<MarkerFile> FoldersWriter::marker_files() const {
  std::vector<MarkerFile> out;
  for (const std::string& file : copied_) {
    if (stat_path(file).size > kMaxHeldObject) {
      out.push_back({dir_ + "/" + file_name(file), "", false, file});
    } else {
      SideFile side = read_side_file(file);
      out.push_back({dir_ + "/" + side.name, std::move(side.bytes)});
    }
  }
  for (MarkerFile& m : folder_markers()) out.push_back(std::move(m));
  return out;
}

}  // namespace ckpt
