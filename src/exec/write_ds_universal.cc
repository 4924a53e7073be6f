#include "exec/write_ds_universal.h"

#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"

namespace ckpt {

namespace fs = std::filesystem;

void write_ds_universal(const CheckpointModel& model, const ds_universal::UniversalPlan& plan,
                        const UniversalOutputOptions& options) {
  AtomicDirectory dir(options.dir, options.force, options.durable);
  for (const ds_universal::UniversalFile& file : plan.files) {
    const fs::path path = dir.path_of(file.path);
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) fail(ErrorCode::kOutputFailed, path.parent_path().string() + ": cannot create: " + ec.message());
    auto sink = AtomicFileSink::create(path.string(), false, options.durable);
    with_context(dir.destination() + "/" + file.path, [&] {
      torch_pt::write_pt(
          *sink, *file.root, file.tensors,
          [&](std::size_t index, archive::ZipWriter& zip) {
            const ds_universal::TensorSource& src = file.sources.at(index);
            if (src.literal) {
              zip.append(src.bytes.data(), src.bytes.size());
              return;
            }
            TensorEntry t = model.tensors.at(src.model_tensor);
            if (file.tensors[index].dtype != t.dtype) t.out_dtype = file.tensors[index].dtype;
            append_tensor(t, zip, options.copy);
          },
          path.stem().string());
    });
    sink->finish();
  }
  if (options.copy.verify) options.copy.verify->check_deferred();  // before anything is published
  dir.commit();
  // ds_to_universal.py writes the folder's name, no newline, beside it; a
  // loader with load_universal and no tag reads it.
  const fs::path dest(options.dir);
  const fs::path latest =
      dest.parent_path().empty() ? fs::path("latest_universal") : dest.parent_path() / "latest_universal";
  auto sink = AtomicFileSink::create(latest.string(), true, options.durable);
  const std::string tag = dest.filename().string();
  sink->write(tag.data(), tag.size());
  sink->finish();
  log::info("wrote " + latest.string() + " (" + tag + ")");
}

}  // namespace ckpt
