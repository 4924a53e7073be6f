#include "exec/write_output.h"

#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/interrupt.h"
#include "formats/safetensors/safetensors_writer.h"
#ifdef CKPT_HAVE_HDF5
#include "formats/hdf5/hdf5_writer.h"
#endif
#include "formats/torch_pt/pt_writer.h"
#include "io/byte_sink.h"
#include "model/validate.h"

namespace ckpt {

std::vector<torch_pt::OutputTensor> pt_output_tensors(const CheckpointModel& model) {
  std::vector<torch_pt::OutputTensor> tensors;
  tensors.reserve(model.tensors.size());
  for (const auto& t : model.tensors)
    tensors.push_back({t.output_dtype(), t.shape, t.storage == StorageKind::kParameter, t.requires_grad});
  return tensors;
}

void write_pt_output(const CheckpointModel& model, const OutputOptions& options) {
  require_valid(model);
  std::vector<torch_pt::OutputTensor> tensors = pt_output_tensors(model);
  auto sink = AtomicFileSink::create(options.path, options.force, options.durable);
  with_context(options.path, [&] {
    torch_pt::write_pt(*sink, *model.root, tensors, [&](std::size_t index, archive::ZipWriter& zip) {
      append_tensor(model.tensors[index], zip, options.copy);
    });
  });
  sink->finish();
}

std::vector<std::string> write_safetensors_output(const CheckpointModel& model, const OutputOptions& options) {
  namespace fs = std::filesystem;
  require_valid(model);
  fs::path out(options.path);
  auto plan = safetensors::plan_safetensors(model, out.filename().string(), options.max_shard_size);
  auto place = [&](const std::string& name) { return (out.parent_path() / name).string(); };
  if (!options.force) {
    // Refuse before writing anything when any planned file exists.
    for (const auto& f : plan.files)
      if (fs::exists(place(f.file_name)))
        fail_invalid(place(f.file_name) + ": output exists (use --force to overwrite)");
  }
  // Shards and index are all written and synced under temporary names first,
  // then renamed, the index last: a failure or an interrupt on the way
  // leaves none of them (each unpublished temporary removes itself).
  std::vector<std::unique_ptr<AtomicFileSink>> sinks;
  for (const auto& f : plan.files) {
    std::string path = place(f.file_name);
    sinks.push_back(AtomicFileSink::create(path, options.force, options.durable));
    with_context(path, [&] {
      safetensors::write_safetensors_file(*sinks.back(), f, [&](std::size_t index, ByteSink& s) {
        append_tensor(model.tensors[index], s, options.copy);
      });
    });
    sinks.back()->complete();
  }
  if (!plan.index_json.empty()) {
    sinks.push_back(
        AtomicFileSink::create(place(out.filename().string() + ".index.json"), options.force, options.durable));
    sinks.back()->write(plan.index_json);
    sinks.back()->complete();
  }
  check_interrupted();
  std::vector<std::string> published;
  try {
    for (auto& sink : sinks) {
      sink->publish();
      published.push_back(sink->destination());
    }
  } catch (const Error&) {
    for (const auto& path : published) ::unlink(path.c_str());  // this run's files: all or none
    throw;
  }
  return published;
}

void write_hdf5_output(const CheckpointModel& model, const OutputOptions& options) {
#ifdef CKPT_HAVE_HDF5
  require_valid(model);
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
#else
  (void)model;
  fail(ErrorCode::kUnimplemented, options.path + ": this ckptconv was built without HDF5 (CKPT_WITH_HDF5=OFF)");
#endif
}

std::optional<OutputFormat> output_format_from_name(const std::string& name) {
  if (name == "pt") return OutputFormat::kPt;
  if (name == "safetensors") return OutputFormat::kSafetensors;
  if (name == "hdf5" || name == "h5") return OutputFormat::kHdf5;
  return std::nullopt;
}

std::optional<OutputFormat> output_format_from_path(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".pt" || ext == ".pth" || ext == ".bin") return OutputFormat::kPt;
  if (ext == ".safetensors") return OutputFormat::kSafetensors;
  if (ext == ".h5" || ext == ".hdf5") return OutputFormat::kHdf5;
  return std::nullopt;
}

const char* output_format_name(OutputFormat format) {
  switch (format) {
    case OutputFormat::kPt: return "pt";
    case OutputFormat::kSafetensors: return "safetensors";
    case OutputFormat::kHdf5: return "hdf5";
  }
  return "?";
}

std::vector<std::string> write_output(const CheckpointModel& model, OutputFormat format, const OutputOptions& options) {
  switch (format) {
    case OutputFormat::kPt: write_pt_output(model, options); break;
    case OutputFormat::kSafetensors: return write_safetensors_output(model, options);
    case OutputFormat::kHdf5: write_hdf5_output(model, options); break;
  }
  return {options.path};
}

}  // namespace ckpt
