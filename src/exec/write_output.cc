#include "exec/write_output.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "archive/zip_writer.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "exec/parted_output.h"
#include "formats/safetensors/safetensors_writer.h"
#ifdef CKPT_HAVE_HDF5
#include "formats/hdf5/hdf5_writer.h"
#endif
#include "core/paths.h"
#include "formats/torch_pt/pt_writer.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"
#include "io/storage.h"
#include "model/validate.h"

namespace ckpt {

std::vector<torch_pt::OutputTensor> pt_output_tensors(const CheckpointModel& model) {
  std::vector<torch_pt::OutputTensor> tensors;
  tensors.reserve(model.tensors.size());
  for (const auto& t : model.tensors)
    tensors.push_back({t.output_dtype(), t.shape, t.storage == StorageKind::kParameter, t.requires_grad});
  return tensors;
}

namespace {

#ifdef CKPT_HAVE_HDF5
// An HDF5 file to s3://: libhdf5 writes a local file by name, so the file is
// spooled in spool_directory() (a temporary file, locked, as a local
// output's: one a killed run leaves is removed by the next), then streamed
// into one multipart upload, completed only when it is all up. The spool is
// removed on success, error and Ctrl-C alike (the sink is never published).
void upload_spooled(const std::string& url, const std::string& spooled, bool overwrite, uint64_t memory_limit) {
  SourcePtr src = open_file_source(spooled);
  const uint64_t size = src->size();
  // The copy is over: the part buffers may have the whole limit.
  const uint64_t part_size = s3_part_size(size);
  S3UploadSink upload(url, part_size, s3_parts_on_the_wire(memory_limit, part_size));
  upload.copy_from(*src, 0, size);
  upload.close();
  check_interrupted();  // an interrupted job leaves nothing, even with every part up
  upload.complete(overwrite);
}

std::vector<std::string> write_hdf5_to_object_store(const CheckpointModel& model, const OutputOptions& options) {
  if (!options.force && path_exists(options.path))
    fail_invalid(options.path + ": output exists (use --force to overwrite)");
  // Named after the object: its temporary file is "<spool>/<name>.tmp-XXXXXX".
  auto spool = AtomicFileSink::create(spool_directory() + "/" + file_name(options.path), /*overwrite=*/true,
                                      /*durable=*/false, options.path);
  with_context(options.path, [&] {
    hdf5::WriteOptions h5;
    h5.gzip = options.gzip;
    hdf5::write_hdf5(spool->temp_path(), model, h5, [&](std::size_t index, ByteSink& sink) {
      append_tensor(model.tensors[index], sink, options.copy);
    });
    check_interrupted();
    upload_spooled(options.path, spool->temp_path(), options.force, options.copy.memory_limit);
  });
  if (options.publish_beside) {  // -o s3://B/DIR/: the folder's side files, config.json last
    try {
      options.publish_beside({options.path});
    } catch (const Error&) {
      s3_delete_object(options.path);
      throw;
    }
  }
  return {options.path};
}
#endif

// HDF5's library writes the file by name, not into a ByteSink, so the
// format has no PartedWriter: this is its whole writer.
std::vector<std::string> write_hdf5(const CheckpointModel& model, const OutputOptions& options) {
#ifdef CKPT_HAVE_HDF5
  if (is_s3_url(options.path)) return write_hdf5_to_object_store(model, options);
  // HDF5 writes the file by name: it truncates and fills the sink's temp
  // file, and the sink's finish() then syncs that inode and renames it into
  // place exactly as for the other formats (NOREPLACE without --force).
  auto temp = AtomicFileSink::create(options.path, options.force, options.durable);
  with_context(options.path, [&] {
    hdf5::WriteOptions h5;
    h5.gzip = options.gzip;
    h5.stream = options.durable;
    hdf5::write_hdf5(temp->temp_path(), model, h5, [&](std::size_t index, ByteSink& sink) {
      append_tensor(model.tensors[index], sink, options.copy);
    });
  });
  temp->finish();
  return {options.path};
#else
  (void)model;
  fail(ErrorCode::kUnimplemented, options.path + ": this ckptconv was built without HDF5 (CKPT_WITH_HDF5=OFF)");
#endif
}

// A torch.save archive of the model's structure with every tensor
// consolidated (contiguous), every tensor emitted in model order.
class PtWriter final : public PartedWriter {
 public:
  PtWriter(const CheckpointModel& model, const OutputOptions& options) : model_(model), out_(options.path) {}
  std::string kind() const override { return "pt"; }
  std::vector<std::string> file_names() const override { return {file_name(out_)}; }
  std::vector<std::string> destinations() const override { return {out_}; }
  std::string output_path(std::size_t) const override { return out_; }
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override {
    torch_pt::write_pt(*sinks.at(0), *model_.root, pt_output_tensors(model_),
                       [&](std::size_t i, archive::ZipWriter& zip) {
                         const TensorEntry& t = model_.tensors.at(i);
                         emit({0, t.output_nbytes(), &t, {}}, *sinks[0], &zip);
                       });
  }
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override {
    rename_all(data_path, destinations(), force);
    if (durable) sync_directory_of(out_);
    return {destinations(), "one file"};
  }
  bool publishes_to_object_store() const override { return true; }

 private:
  const CheckpointModel& model_;
  std::string out_;
};

// A safetensors file (formats/safetensors/safetensors_writer.h), or with
// max_shard_size the shards "<stem>-0000i-of-0000N.safetensors" beside
// OUT and "<name>.index.json" (when more than one shard is needed): the
// shards first, the index last.
class SafetensorsWriter final : public PartedWriter {
 public:
  SafetensorsWriter(const CheckpointModel& model, const OutputOptions& options)
      : model_(model),
        out_(options.path),
        plan_(safetensors::plan_safetensors(model, file_name(out_), options.max_shard_size)) {}
  std::string kind() const override { return "safetensors"; }
  std::vector<std::string> file_names() const override {
    std::vector<std::string> names;
    for (const auto& f : plan_.files) names.push_back(f.file_name);
    return names;
  }
  std::vector<std::string> destinations() const override {
    std::vector<std::string> paths;
    for (std::size_t k = 0; k < plan_.files.size(); ++k) paths.push_back(output_path(k));
    return paths;
  }
  std::string output_path(std::size_t k) const override {
    return path_join(parent_dir(out_), plan_.files.at(k).file_name);
  }
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override {
    for (std::size_t k = 0; k < plan_.files.size(); ++k)
      safetensors::write_safetensors_file(*sinks.at(k), plan_.files[k], [&](std::size_t i, ByteSink& s) {
        const TensorEntry& t = model_.tensors.at(i);
        emit({k, t.output_nbytes(), &t, {}}, s, nullptr);
      });
  }
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override {
    std::vector<std::string> to = destinations();
    std::unique_ptr<AtomicFileSink> index;
    if (!plan_.index_json.empty()) {
      index = AtomicFileSink::create(out_ + ".index.json", force, durable);
      index->write(plan_.index_json);
      index->complete();
    }
    check_interrupted();
    rename_all(data_path, to, force);
    try {
      if (index) index->publish();  // its publish() syncs the directory, the renames above included
    } catch (const Error&) {
      for (const auto& f : to) storage_for(f).remove(f);
      throw;
    }
    if (durable && !index) sync_directory_of(out_);
    std::vector<std::string> files = to;
    if (index) files.push_back(index->destination());
    return {files, to.size() > 1 ? std::to_string(to.size()) + " shards and the index" : std::string("one file")};
  }
  bool publishes_to_object_store() const override { return true; }
  std::vector<MarkerFile> marker_files() const override {
    if (plan_.index_json.empty()) return {};
    return {{out_ + ".index.json", plan_.index_json}};
  }

 private:
  const CheckpointModel& model_;
  std::string out_;
  safetensors::Plan plan_;
};

template <class Writer>
std::unique_ptr<PartedWriter> parted(const CheckpointModel& model, const OutputOptions& options) {
  return std::make_unique<Writer>(model, options);
}

}  // namespace

const std::vector<OutputFormatInfo>& output_formats() {
  static const std::vector<OutputFormatInfo> formats = {
      {.id = OutputFormat::kPt,
       .name = "pt",
       .aliases = {},
       .extensions = {".pt", ".pth", ".bin"},
       .weights_file = "pytorch_model.bin",
       .full_file = "full.pt",
       .parted = parted<PtWriter>},
      {.id = OutputFormat::kSafetensors,
       .name = "safetensors",
       .aliases = {},
       .extensions = {".safetensors"},
       .weights_file = "model.safetensors",
       .full_file = "full.safetensors",
       .shards = true,
       .parted = parted<SafetensorsWriter>},
      // Several processes cannot write one HDF5 file without an MPI-IO build of libhdf5.
      {.id = OutputFormat::kHdf5,
       .name = "hdf5",
       .aliases = {"h5"},
       .extensions = {".h5", ".hdf5"},
       .weights_file = "model.h5",
       .full_file = "full.h5",
       .compression = true,
       .write = write_hdf5},
  };
  return formats;
}

const OutputFormatInfo& output_format_info(OutputFormat format) {
  for (const auto& f : output_formats())
    if (f.id == format) return f;
  fail(ErrorCode::kInternal, "no output format registered for this id");
}

std::optional<OutputFormat> output_format_from_name(const std::string& name) {
  for (const auto& f : output_formats())
    if (name == f.name || std::find(f.aliases.begin(), f.aliases.end(), name) != f.aliases.end()) return f.id;
  return std::nullopt;
}

std::optional<OutputFormat> output_format_from_path(const std::string& path) {
  std::string ext = file_extension(path);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& f : output_formats())
    if (std::find(f.extensions.begin(), f.extensions.end(), ext) != f.extensions.end()) return f.id;
  return std::nullopt;
}

const char* output_format_name(OutputFormat format) { return output_format_info(format).name.data(); }

std::string output_extensions_text() {
  std::string out;
  for (const auto& f : output_formats()) {
    std::string exts;
    for (const auto& e : f.extensions) exts += (exts.empty() ? "" : ", ") + std::string(e);
    out += (out.empty() ? "" : ", ") + exts + " (" + std::string(f.name) + ")";
  }
  return out;
}

std::vector<std::string> write_output(const CheckpointModel& model, OutputFormat format, const OutputOptions& options) {
  require_valid(model);
  const OutputFormatInfo& f = output_format_info(format);
  if (!f.parted) return f.write(model, options);
  std::unique_ptr<PartedWriter> w = f.parted(model, options);
  PartedOptions whole;
  whole.path = options.path;
  whole.force = options.force;
  whole.durable = options.durable;
  whole.copy = options.copy;
  whole.publish_beside = options.publish_beside;
  return write_whole(*w, whole).files;
}

PartOutcome write_output_part(const CheckpointModel& model, OutputFormat format, const OutputOptions& options,
                              const PartSpec& part, const std::string& request) {
  require_valid(model);
  const OutputFormatInfo& f = output_format_info(format);
  if (!f.parted)
    fail_invalid("--part: " + std::string(f.name) +
                 " output cannot be written by several processes (HDF5 needs an MPI-IO build of libhdf5); write "
                 ".pt or .safetensors, or run without --part");
  std::unique_ptr<PartedWriter> w = f.parted(model, options);
  return write_parted(*w,
                      {.path = options.path,
                       .force = options.force,
                       .durable = options.durable,
                       .copy = options.copy,
                       .inputs = model.info.files,
                       .request = request,
                       .publish_beside = options.publish_beside},
                      part);
}

}  // namespace ckpt
