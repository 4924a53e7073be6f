#include "exec/write_fsdp1_flat.h"

#include <filesystem>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"

namespace ckpt {

void write_fsdp1_flat(const fsdp_flat::FlatPlan& plan, const RankFilesOptions& options) {
  AtomicDirectory dir(options.dir, options.force, options.durable);
  for (const auto& file : plan.files) {
    auto sink = AtomicFileSink::create(dir.path_of(file.path), false, options.durable);
    with_context(dir.destination() + "/" + file.path, [&] {
      // torch.save names the archive folder after the file's stem.
      torch_pt::write_pt(
          *sink, *file.root, file.tensors,
          [&](std::size_t i, archive::ZipWriter& zip) { append_tensor(file.sources[i], zip, options.copy); },
          std::filesystem::path(file.path).stem().string());
    });
    sink->finish();
  }
  if (options.copy.verify) options.copy.verify->check_deferred();  // before anything is published
  dir.commit();
}

}  // namespace ckpt
