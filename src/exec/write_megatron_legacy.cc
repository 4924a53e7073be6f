#include "exec/write_megatron_legacy.h"

#include "core/error.h"
#include "core/paths.h"
#include "formats/megatron_legacy/legacy_reader.h"
#include "formats/torch_pt/pt_writer.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"
#include "pickle/framework_objects.h"

namespace ckpt {

MegatronLegacyWriter::MegatronLegacyWriter(const megatron_legacy::LegacyOutput& plan, std::string dir)
    : plan_(plan), dir_(without_trailing_slashes(std::move(dir))) {}

std::vector<std::string> MegatronLegacyWriter::file_names() const {
  std::vector<std::string> names;
  for (const auto& f : plan_.files) names.push_back(f.name);
  return names;
}

std::string MegatronLegacyWriter::output_path(std::size_t k) const { return dir_ + "/" + plan_.files.at(k).name; }

void MegatronLegacyWriter::run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) {
  for (std::size_t k = 0; k < plan_.files.size(); ++k) {
    const megatron_legacy::LegacyRankFile& file = plan_.files[k];
    std::vector<torch_pt::OutputTensor> tensors;
    for (const TensorEntry& t : file.tensors) tensors.push_back({t.output_dtype(), t.shape, false, false});
    ByteSink& sink = *sinks.at(k);
    with_context(file.name, [&] {
      // args as the Namespace it was, megatron enums as themselves:
      // Megatron-LM loads the file with weights_only=False.
      torch_pt::write_pt(
          sink, *pickle::with_stored_objects(file.root), tensors,
          [&](std::size_t i, archive::ZipWriter& zip) {
            emit({k, file.tensors.at(i).output_nbytes(), &file.tensors[i], {}}, sink, &zip);
          },
          file_stem(file.name));  // torch.save names the archive folder after the file
    });
  }
}

Published MegatronLegacyWriter::publish(const std::function<std::string(std::size_t)>& data_path, bool force,
                                        bool durable) {
  return publish_directory(dir_, file_names(), data_path, force, durable, [&](const std::string& temp) {
    auto tracker = AtomicFileSink::create(path_join(temp, megatron_legacy::kTrackerFile), false, durable);
    tracker->write(plan_.tracker);
    tracker->finish();
  });
}

std::vector<MarkerFile> MegatronLegacyWriter::marker_files() const {
  return {{path_join(dir_, megatron_legacy::kTrackerFile), plan_.tracker}};
}

}  // namespace ckpt
