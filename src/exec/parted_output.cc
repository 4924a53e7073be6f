#include "exec/parted_output.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "archive/zip_writer.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"
#include "io/part_sink.h"
#include "io/s3_storage.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"
#include "io/storage.h"

namespace ckpt {
namespace {

// File k of a one-process run: made in the scratch folder on its first
// byte, so that a writer filling its files in order has one open at a time
// (a universal checkpoint has thousands of files; the default limit on open
// descriptors is 1,024).
class StagedFile final : public ByteSink {
 public:
  StagedFile(std::string path, std::string label, bool durable, std::function<void()> on_open)
      : path_(std::move(path)), label_(std::move(label)), durable_(durable), on_open_(std::move(on_open)) {}
  using ByteSink::write;
  void write(const void* data, std::size_t n) override { open().write(data, n); }
  uint64_t position() const override { return file_ ? file_->position() : 0; }
  void copy_from(const ByteSource& src, uint64_t pos, uint64_t n) override { open().copy_from(src, pos, n); }
  // Complete (synced when durable) and closed; where it is. A later write
  // is an Internal error: the writer did not fill its files in order.
  std::string close() {
    open();
    return file_->detach();
  }

 private:
  AtomicFileSink& open() {
    if (!file_) {
      if (on_open_) on_open_();
      file_ = AtomicFileSink::create_staged(path_, durable_, label_);
    }
    return *file_;
  }

  std::string path_, label_;
  bool durable_;
  std::function<void()> on_open_;
  std::unique_ptr<AtomicFileSink> file_;
};

// File k of an s3:// output: its multipart upload, started on the first
// byte as a StagedFile is made, so that a writer filling its files in order
// holds one part buffer at a time.
class UploadFile final : public ByteSink {
 public:
  UploadFile(std::string url, uint64_t part_size, unsigned parts_on_the_wire, std::function<void()> on_open)
      : url_(std::move(url)),
        part_size_(part_size),
        parts_on_the_wire_(parts_on_the_wire),
        on_open_(std::move(on_open)) {}
  using ByteSink::write;
  void write(const void* data, std::size_t n) override { open().write(data, n); }
  uint64_t position() const override { return upload_ ? upload_->position() : 0; }
  void copy_from(const ByteSource& src, uint64_t pos, uint64_t n) override { open().copy_from(src, pos, n); }
  // Every byte uploaded, the object still invisible (an empty file too).
  void close() { open().close(); }
  void complete(bool overwrite) { open().complete(overwrite); }
  const std::string& url() const { return url_; }

 private:
  S3UploadSink& open() {
    if (!upload_) {
      if (on_open_) on_open_();
      upload_ = std::make_unique<S3UploadSink>(url_, part_size_, parts_on_the_wire_);
    }
    return *upload_;
  }

  std::string url_;
  uint64_t part_size_;
  unsigned parts_on_the_wire_;
  std::function<void()> on_open_;
  std::unique_ptr<S3UploadSink> upload_;  // destroyed uncompleted: aborted
};

// Runs the writer over one sink per output file, every unit of the files
// `writes(k)` says written whole, the others' skipped (no byte of theirs
// read; their sinks only count); a failure names the file it was writing.
void write_units(PartedWriter& w, const std::vector<ByteSink*>& sinks, const CopyOptions& copy,
                 const std::function<bool(std::size_t)>& writes) {
  w.run(sinks, [&](const PartUnit& u, ByteSink& sink, archive::ZipWriter* zip) {
    if (!writes(u.file)) {
      skip_unit(u, sink, zip);
      return;
    }
    try {
      write_unit(u, sink, zip, copy);
    } catch (Error& e) {
      e.add_context(w.output_path(u.file));  // named only on failure: a run emits thousands of units
      throw;
    }
  });
}

// One process, every unit written (no --part).
template <class File>
void write_every_unit(PartedWriter& w, const std::vector<std::unique_ptr<File>>& files, const CopyOptions& copy) {
  std::vector<ByteSink*> sinks;
  for (const auto& f : files) sinks.push_back(f.get());
  write_units(w, sinks, copy, [](std::size_t) { return true; });
}

// The files [first, end) of an s3:// output whose part buffers, written
// together, fit in `budget` (at least one file): a part each, or the whole
// of a file smaller than a part.
std::size_t files_within(const std::vector<uint64_t>& sizes, std::size_t first, uint64_t budget) {
  std::size_t end = first;
  uint64_t held = 0;
  do {
    held += std::min(sizes[end], s3_part_size(sizes[end]));
    ++end;
  } while (end < sizes.size() && held + std::min(sizes[end], s3_part_size(sizes[end])) <= budget);
  return end;
}

// write_whole for an s3:// OUT: every data file streamed into its own
// multipart upload (no local copy), then, all of them written, completed in
// order and the marker files put after them, the checkpoint's marker last.
// An error or an interrupt before that aborts every upload (nothing was
// visible); one while publishing also deletes the objects already
// published. Each file being written holds a part buffer: a writer that
// fills its files in order holds one; one that fills them together (DCP,
// every rank's file item by item) runs once per group of files whose
// buffers fit in half of --memory-limit (the copy's slabs get the other
// half), skipping the other files' units, so memory stays bounded whatever
// the world size.
Published write_whole_to_object_store(PartedWriter& w, const PartedOptions& options) {
  if (!w.publishes_to_object_store())
    fail(ErrorCode::kOutputFailed, options.path + ": writing a " + w.kind() +
                                       " output to s3:// is not supported yet: write it locally and upload it "
                                       "(docs/object-storage.md)");
  if (!options.force) refuse_existing(w);
  // Each file's exact size (no tensor bytes read) sets its part size: 10,000
  // parts at most, so a file past 80 GB gets parts larger than 8 MiB.
  const std::vector<uint64_t> sizes = output_sizes(w);
  const std::size_t count = sizes.size();
  // A writer that fills its files in order has one file open: a quarter of
  // --memory-limit holds its parts on the wire (up to 4 of 8 MiB by
  // default) and the part being filled, and the copy's slabs the rest. One
  // that fills them together (DCP) sends each file's parts one at a time.
  uint64_t largest_part = 0;
  for (uint64_t size : sizes) largest_part = std::max(largest_part, std::min(size, s3_part_size(size)));
  const unsigned on_the_wire =
      w.fills_files_in_order() ? s3_parts_on_the_wire(options.copy.memory_limit / 4, largest_part) : 0;
  std::vector<std::unique_ptr<UploadFile>> files;
  std::size_t closed = 0;  // files [0, closed) are uploaded
  for (std::size_t k = 0; k < count; ++k) {
    std::function<void()> on_open;
    if (w.fills_files_in_order())
      on_open = [&, k] {
        for (; closed < k; ++closed) files[closed]->close();
      };
    files.push_back(
        std::make_unique<UploadFile>(w.output_path(k), s3_part_size(sizes[k]), on_the_wire, std::move(on_open)));
  }
  if (w.fills_files_in_order()) {
    CopyOptions copy = options.copy;
    if (on_the_wire > 0) copy.memory_limit -= (on_the_wire + 1) * largest_part;
    write_every_unit(w, files, copy);
  } else {
    // One budget: the part buffers of the files written together and the
    // copy's slabs share --memory-limit half and half (they used to get it
    // each, up to twice the limit together).
    CopyOptions copy = options.copy;
    copy.memory_limit = options.copy.memory_limit / 2;
    const uint64_t part_buffers = options.copy.memory_limit - copy.memory_limit;
    for (std::size_t first = 0; first < count;) {
      const std::size_t end = files_within(sizes, first, part_buffers);
      std::vector<PartSink> counters;  // the other files' bytes, counted and dropped
      for (std::size_t k = 0; k < count; ++k) counters.emplace_back(-1, PartSink::Ranges{}, w.output_path(k));
      std::vector<ByteSink*> sinks;
      for (std::size_t k = 0; k < count; ++k)
        sinks.push_back(k >= first && k < end ? static_cast<ByteSink*>(files[k].get()) : &counters[k]);
      write_units(w, sinks, copy, [&](std::size_t k) { return k >= first && k < end; });
      for (std::size_t k = first; k < end; ++k) files[k]->close();
      first = end;
    }
  }
  if (options.copy.verify) options.copy.verify->check_deferred();  // before anything is published
  for (; closed < count; ++closed) files[closed]->close();
  check_interrupted();  // an interrupted job leaves nothing, even when its files are uploaded
  return publish_uploads(w, options, [&](std::size_t k, bool overwrite) { files[k]->complete(overwrite); });
}

}  // namespace

Published write_whole(PartedWriter& w, const PartedOptions& options) {
  if (is_s3_url(options.path)) return write_whole_to_object_store(w, options);
  if (!options.force) refuse_existing(w);
  // A scratch folder, never committed: its destructor removes it and
  // whatever is still in it. Its name is OUT's temporary name, so a run
  // killed by SIGKILL leaves a folder the next run removes (io/temp_output.h).
  AtomicDirectory scratch(options.path, /*force=*/true, /*durable=*/false);
  const std::size_t count = w.file_names().size();
  std::vector<std::unique_ptr<StagedFile>> files;
  std::vector<std::string> paths(count);
  std::size_t closed = 0;  // files [0, closed) are complete
  for (std::size_t k = 0; k < count; ++k) {
    std::function<void()> on_open;
    if (w.fills_files_in_order())
      on_open = [&, k] {
        for (; closed < k; ++closed) paths[closed] = files[closed]->close();
      };
    files.push_back(std::make_unique<StagedFile>(scratch.path_of("data-" + std::to_string(k)), w.output_path(k),
                                                 options.durable, std::move(on_open)));
  }
  write_every_unit(w, files, options.copy);
  if (options.copy.verify) options.copy.verify->check_deferred();  // before anything is published
  for (; closed < count; ++closed) paths[closed] = files[closed]->close();
  check_interrupted();  // an interrupted job leaves nothing, even when its files are done
  return w.publish([&](std::size_t k) { return paths.at(k); }, options.force, options.durable);
}

std::vector<uint64_t> output_sizes(PartedWriter& w) {
  std::vector<PartSink> counters;
  for (const auto& name : w.file_names()) counters.emplace_back(-1, PartSink::Ranges{}, name);
  std::vector<ByteSink*> sinks;
  for (auto& c : counters) sinks.push_back(&c);
  w.run(sinks, [](const PartUnit& u, ByteSink& sink, archive::ZipWriter* zip) { skip_unit(u, sink, zip); });
  std::vector<uint64_t> sizes;
  for (const auto& c : counters) sizes.push_back(c.position());
  return sizes;
}

void rename_all(const std::function<std::string(std::size_t)>& data_path, const std::vector<std::string>& to,
                bool force) {
  std::vector<std::string> published;
  try {
    for (std::size_t k = 0; k < to.size(); ++k) {
      rename_into_place(data_path(k), to[k], force);
      published.push_back(to[k]);
    }
  } catch (const Error&) {
    for (const auto& f : published) storage_for(f).remove(f);
    throw;
  }
}

PartedOptions directory_output(const std::string& dir, bool force, bool durable, const CopyOptions& copy,
                               const CheckpointModel& model, const std::string& request) {
  return {.path = dir,
          .force = force,
          .durable = durable,
          .copy = copy,
          .inputs = model.info.files,
          .request = request,
          .publish_beside = {}};
}

Published publish_directory(const std::string& dir, const std::vector<std::string>& names,
                            const std::function<std::string(std::size_t)>& data_path, bool force, bool durable,
                            const std::function<void(const std::string& temp_dir)>& extra) {
  AtomicDirectory out(dir, force, durable);
  for (std::size_t k = 0; k < names.size(); ++k) {
    std::string to = out.path_of(names[k]);
    // A file in a folder of the output (zero/<fqn>/fp32.pt): its folders first.
    for (std::size_t slash = names[k].find('/'); slash != std::string::npos; slash = names[k].find('/', slash + 1)) {
      const std::string folder = out.path_of(names[k].substr(0, slash));
      storage_for(folder).make_directory(folder);  // false when an earlier file made it
    }
    rename_into_place(data_path(k), to, false);  // into a folder this run just made
  }
  if (extra) extra(out.temp_dir());
  out.commit();
  return {{out.destination()}, std::to_string(names.size()) + " files"};
}

}  // namespace ckpt
