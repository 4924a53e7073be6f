#include "exec/write_fsdp1_flat.h"

#include <filesystem>

#include "core/error.h"
#include "core/paths.h"
#include "io/atomic_dir.h"

namespace ckpt {

FlatWriter::FlatWriter(const fsdp_flat::FlatPlan& plan, std::string dir)
    : plan_(plan), dir_(without_trailing_slashes(std::move(dir))) {}

std::vector<std::string> FlatWriter::file_names() const {
  std::vector<std::string> names;
  for (const auto& f : plan_.files) names.push_back(f.path);
  return names;
}

void FlatWriter::run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) {
  for (std::size_t k = 0; k < plan_.files.size(); ++k) {
    const fsdp_flat::FlatFile& file = plan_.files[k];
    ByteSink& sink = *sinks.at(k);
    // torch.save names the archive folder after the file's stem.
    torch_pt::write_pt(
        sink, *file.root, file.tensors,
        [&](std::size_t i, archive::ZipWriter& zip) {
          emit({k, file.sources.at(i).output_nbytes(), &file.sources[i], {}}, sink, &zip);
        },
        file_stem(file.path));
  }
}

Published FlatWriter::publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) {
  return publish_directory(dir_, file_names(), data_path, force, durable, nullptr);
}

}  // namespace ckpt
