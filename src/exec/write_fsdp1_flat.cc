#include "exec/write_fsdp1_flat.h"

#include <filesystem>

#include "core/error.h"
#include "exec/parted_output.h"
#include "io/atomic_dir.h"

namespace ckpt {
namespace {

// Every rank's files of the plan, then the folder published.
class FlatParted final : public PartedWriter {
 public:
  FlatParted(const fsdp_flat::FlatPlan& plan, const RankFilesOptions& options) : plan_(plan), options_(options) {}
  std::string kind() const override { return "fsdp1-flat"; }
  std::vector<std::string> file_names() const override {
    std::vector<std::string> names;
    for (const auto& f : plan_.files) names.push_back(f.path);
    return names;
  }
  std::vector<std::string> destinations() const override { return {without_trailing_slashes(options_.dir)}; }
  std::string output_path(std::size_t k) const override {
    return without_trailing_slashes(options_.dir) + "/" + plan_.files.at(k).path;
  }
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override {
    for (std::size_t k = 0; k < plan_.files.size(); ++k) {
      const fsdp_flat::FlatFile& file = plan_.files[k];
      ByteSink& sink = *sinks.at(k);
      // torch.save names the archive folder after the file's stem.
      torch_pt::write_pt(
          sink, *file.root, file.tensors,
          [&](std::size_t i, archive::ZipWriter& zip) {
            emit({k, file.sources.at(i).output_nbytes(), &file.sources[i], {}}, sink, &zip);
          },
          std::filesystem::path(file.path).stem().string());
    }
  }
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override {
    return publish_directory(options_.dir, file_names(), data_path, force, durable, nullptr);
  }

 private:
  const fsdp_flat::FlatPlan& plan_;
  const RankFilesOptions& options_;
};

}  // namespace

void write_fsdp1_flat(const fsdp_flat::FlatPlan& plan, const RankFilesOptions& options) {
  FlatParted writer(plan, options);
  write_whole(writer, {.path = options.dir, .force = options.force, .durable = options.durable, .copy = options.copy});
}

PartOutcome write_fsdp1_flat_part(const CheckpointModel& model, const fsdp_flat::FlatPlan& plan,
                                  const RankFilesOptions& options, const PartSpec& part, const std::string& request) {
  FlatParted writer(plan, options);
  return write_parted(
      writer, directory_output(options.dir, options.force, options.durable, options.copy, model, request), part);
}

}  // namespace ckpt
