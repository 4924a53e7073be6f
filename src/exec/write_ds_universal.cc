#include "exec/write_ds_universal.h"

#include <filesystem>
#include <functional>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"
#include "io/storage.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ds_universal::UniversalFile;
using ds_universal::UniversalPlan;

// Tensors `parts` of the model (one shape and dtype) as one tensor stacked
// along a new first dimension: each part's chunks at its index there. No
// byte is moved; the copy engine reads each part's chunks as before.
TensorEntry stacked(const CheckpointModel& model, const std::vector<std::size_t>& parts) {
  const TensorEntry& first = model.tensors.at(parts.at(0));
  TensorEntry out = first;
  out.chunks.clear();
  out.shape.insert(out.shape.begin(), int64_t(parts.size()));
  for (std::size_t e = 0; e < parts.size(); ++e) {
    const TensorEntry& t = model.tensors.at(parts[e]);
    if (t.shape != first.shape || t.dtype != first.dtype)
      fail(ErrorCode::kInternal,
           "stacking " + t.name + " " + shape_str(t.shape) + " onto " + first.name + " " + shape_str(first.shape));
    for (TensorChunk c : t.chunks) {
      c.offsets.insert(c.offsets.begin(), int64_t(e));
      c.strides.insert(c.strides.begin(), int64_t(std::max<uint64_t>(1, c.numel())));
      c.sizes.insert(c.sizes.begin(), 1);
      out.chunks.push_back(std::move(c));
    }
  }
  return out;
}

// Per file, the tensors as the copy engine reads them: the model's, cast to
// the file's dtype (fp32 for the per-parameter files). Literal sources
// (a Python int step) have an unused placeholder.
std::vector<std::vector<TensorEntry>> sources_of(const CheckpointModel& model, const UniversalPlan& plan) {
  std::vector<std::vector<TensorEntry>> out(plan.files.size());
  for (std::size_t k = 0; k < plan.files.size(); ++k) {
    const UniversalFile& f = plan.files[k];
    for (std::size_t i = 0; i < f.tensors.size(); ++i) {
      TensorEntry t = f.sources[i].literal            ? TensorEntry{}
                      : !f.sources[i].stacked.empty() ? stacked(model, f.sources[i].stacked)
                                                      : model.tensors.at(f.sources[i].model_tensor);
      if (!f.sources[i].literal && f.tensors[i].dtype != t.dtype) t.out_dtype = f.tensors[i].dtype;
      out[k].push_back(std::move(t));
    }
  }
  return out;
}

// One file as torch.save writes it (its archive folder is the file's stem);
// `fill` appends tensor i's bytes.
void write_file(ByteSink& sink, const UniversalFile& f, const torch_pt::FillTensor& fill) {
  torch_pt::write_pt(sink, *f.root, f.tensors, fill, fs::path(f.path).stem().string());
}

fs::path latest_beside(const std::string& dir) {
  const fs::path dest(without_trailing_slashes(dir));
  return dest.parent_path().empty() ? fs::path("latest_universal") : dest.parent_path() / "latest_universal";
}

std::string tag_of(const std::string& dir) { return fs::path(without_trailing_slashes(dir)).filename().string(); }

// Whether latest_universal is (re)written: not when one exists and
// --update-latest was not given (see prepare_latest).
bool writes_latest(const std::string& dir, bool update) {
  const fs::path latest = latest_beside(dir);
  if (!path_exists(latest.string()) || update) return true;  // a link too, dangling or not
  log::info("kept " + latest.string() + " as it is; --update-latest points it at " + tag_of(dir));
  return false;
}

// ds_to_universal.py writes the folder's name, no newline, beside it; a
// loader with load_universal and no tag reads it. An existing pointer may be
// what this job read its source through, and other jobs resume from what it
// names: it is replaced only when asked (--update-latest). The sink is made
// and written before the folder is published, so a pointer that cannot be
// written fails the job with nothing published; nullptr: none to write.
std::unique_ptr<AtomicFileSink> prepare_latest(const std::string& dir, bool update, bool durable) {
  if (!writes_latest(dir, update)) return nullptr;
  auto sink = AtomicFileSink::create(latest_beside(dir).string(), true, durable);
  const std::string tag = tag_of(dir);
  sink->write(tag.data(), tag.size());
  return sink;
}

}  // namespace

UniversalWriter::UniversalWriter(const CheckpointModel& model, const UniversalPlan& plan, std::string dir,
                                 bool update_latest)
    : plan_(plan),
      dir_(without_trailing_slashes(std::move(dir))),
      update_latest_(update_latest),
      sources_(sources_of(model, plan)) {}

std::vector<std::string> UniversalWriter::file_names() const {
  std::vector<std::string> names;
  for (const auto& f : plan_.files) names.push_back(f.path);
  return names;
}

std::string UniversalWriter::output_path(std::size_t k) const { return dir_ + "/" + plan_.files.at(k).path; }

void UniversalWriter::run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) {
  for (std::size_t k = 0; k < plan_.files.size(); ++k) {
    const UniversalFile& f = plan_.files[k];
    ByteSink& sink = *sinks.at(k);
    write_file(sink, f, [&](std::size_t i, archive::ZipWriter& zip) {
      if (f.sources[i].literal)
        emit({k, f.sources[i].bytes.size(), nullptr, f.sources[i].bytes}, sink, &zip);
      else
        emit({k, sources_[k][i].output_nbytes(), &sources_[k][i], {}}, sink, &zip);
    });
  }
}

Published UniversalWriter::publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) {
  std::unique_ptr<AtomicFileSink> latest = prepare_latest(dir_, update_latest_, durable);
  Published done = publish_directory(dir_, file_names(), data_path, force, durable, nullptr);
  if (latest) {
    latest->finish();
    log::info("wrote " + latest_beside(dir_).string() + " (" + fs::path(dir_).filename().string() + ")");
  }
  return done;
}

std::vector<MarkerFile> UniversalWriter::marker_files() const {
  if (!writes_latest(dir_, update_latest_)) return {};
  // Put over an existing pointer only when asked, as the local rename does;
  // without --update-latest a pointer that appeared meanwhile is kept (412).
  return {{.path = latest_beside(dir_).string(), .bytes = tag_of(dir_), .replace = update_latest_}};
}

}  // namespace ckpt
