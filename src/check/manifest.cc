#include "check/manifest.h"

#include <map>

#include "core/error.h"
#include "io/byte_sink.h"
#include "io/byte_source.h"
#include "io/containment.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"
#include "model/ordered_json.h"

namespace ckpt::check {
namespace {

using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxManifestSize = 1'000'000'000;

template <class T>
T field(const Json& j, const char* name, const std::string& where) {
  auto it = j.find(name);
  if (it == j.end()) fail_data_loss(where + ": no \"" + name + "\"");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    fail_data_loss(where + ": \"" + name + "\" has the wrong type");
  }
}

std::string shape_text(const Shape& s) { return shape_str(s); }

}  // namespace

Json manifest_to_json(const Manifest& m) {
  Json j;
  j["schema_version"] = kManifestSchemaVersion;
  j["kind"] = "ckptconv-manifest";
  j["algorithm"] = checksum_algorithm_name(m.algorithm);
  j["source"] = m.source;
  j["format"] = m.format;
  j["world_size"] = m.world_size;
  Json files = Json::array(), tensors = Json::array();
  for (const auto& f : m.files) files.push_back({{"path", f.path}, {"bytes", f.bytes}, {"checksum", f.checksum}});
  for (const auto& t : m.tensors)
    tensors.push_back({{"key", t.key}, {"dtype", t.dtype}, {"shape", t.shape}, {"checksum", t.checksum}});
  j["files"] = files;
  j["tensors"] = tensors;
  return j;
}

Manifest manifest_from_json(const Json& j, const std::string& path) {
  if (!j.is_object() || j.value("kind", "") != "ckptconv-manifest") fail_data_loss(path + ": not a ckptconv manifest");
  int version = field<int>(j, "schema_version", path);
  if (version != kManifestSchemaVersion)
    fail_data_loss(path + ": manifest schema_version " + std::to_string(version) + " (this ckptconv reads " +
                   std::to_string(kManifestSchemaVersion) + ")");
  Manifest m;
  auto algorithm = checksum_algorithm_from_name(field<std::string>(j, "algorithm", path));
  if (!algorithm) fail_data_loss(path + ": unknown checksum algorithm '" + j["algorithm"].dump() + "'");
  m.algorithm = *algorithm;
  m.source = field<std::string>(j, "source", path);
  m.format = field<std::string>(j, "format", path);
  m.world_size = field<int>(j, "world_size", path);
  for (const auto& f : field<Json>(j, "files", path))
    m.files.push_back({field<std::string>(f, "path", path), field<uint64_t>(f, "bytes", path),
                       field<std::string>(f, "checksum", path)});
  for (const auto& t : field<Json>(j, "tensors", path))
    m.tensors.push_back({field<std::string>(t, "key", path), field<std::string>(t, "dtype", path),
                         field<Shape>(t, "shape", path), field<std::string>(t, "checksum", path)});
  return m;
}

Manifest read_manifest(const std::string& path) {
  trust_given_path(path);  // named by the user: read wherever it links
  SourcePtr src = open_file_source(path);
  if (src->size() > kMaxManifestSize)
    fail_data_loss(path + ": larger than " + std::to_string(kMaxManifestSize) + " bytes");
  Json j = parse_checkpoint_json(src->read_string(0, static_cast<std::size_t>(src->size())), path);
  return manifest_from_json(j, path);
}

void write_manifest(const Manifest& manifest, const std::string& path, bool force) {
  if (is_s3_url(path))
    return s3_put_object(path, manifest_to_json(manifest).dump(2) + "\n", force);  // one PUT: whole or absent
  auto sink = AtomicFileSink::create(path, force);
  sink->write(manifest_to_json(manifest).dump(2) + "\n");
  sink->finish();
}

ManifestComparison compare_manifests(const Manifest& recorded, const Manifest& now, const std::string& manifest_path,
                                     ProblemSink& sink) {
  ManifestComparison out;
  auto report = [&](std::string message, std::string file, std::string tensor) {
    sink.report(Problem{ErrorCode::kDataLoss, std::move(message), std::move(file), -1, std::move(tensor)});
  };
  out.files_compared = recorded.format == now.format && recorded.world_size == now.world_size;
  if (!out.files_compared) {
    out.note = "files not compared: the manifest describes a " + recorded.format + " checkpoint of world size " +
               std::to_string(recorded.world_size) + ", this is a " + now.format + " checkpoint of world size " +
               std::to_string(now.world_size) + "; tensors compared by their logical bytes";
  } else {
    std::map<std::string, const ManifestFile*> have;
    for (const auto& f : now.files) have[f.path] = &f;
    for (const auto& f : recorded.files) {
      auto it = have.find(f.path);
      if (it == have.end()) {
        report("file '" + f.path + "' is in the manifest " + manifest_path + " but not in the checkpoint", f.path, "");
        ++out.missing;
        continue;
      }
      if (it->second->checksum != f.checksum || it->second->bytes != f.bytes) {
        report("file '" + f.path + "' changed since the manifest " + manifest_path +
                   " was written: " + std::to_string(f.bytes) + " bytes, " +
                   checksum_algorithm_name(recorded.algorithm) + " " + f.checksum + " then; " +
                   std::to_string(it->second->bytes) + " bytes, " + it->second->checksum + " now",
               f.path, "");
        ++out.changed;
      }
      have.erase(it);
    }
    for (const auto& [path, f] : have) {
      report("file '" + path + "' is not in the manifest " + manifest_path, path, "");
      ++out.added;
    }
  }
  std::map<std::string, const ManifestTensor*> have;
  for (const auto& t : now.tensors) have[t.key] = &t;
  for (const auto& t : recorded.tensors) {
    auto it = have.find(t.key);
    if (it == have.end()) {
      report("tensor '" + t.key + "' is in the manifest " + manifest_path + " but not in the checkpoint", "", t.key);
      ++out.missing;
      continue;
    }
    const ManifestTensor& n = *it->second;
    if (n.dtype != t.dtype || n.shape != t.shape) {
      report("tensor '" + t.key + "' was " + t.dtype + " " + shape_text(t.shape) + " when the manifest " +
                 manifest_path + " was written, now " + n.dtype + " " + shape_text(n.shape),
             "", t.key);
      ++out.changed;
    } else if (n.checksum != t.checksum) {
      report("tensor '" + t.key + "' changed since the manifest " + manifest_path + " was written: " +
                 checksum_algorithm_name(recorded.algorithm) + " " + t.checksum + " then, " + n.checksum + " now",
             "", t.key);
      ++out.changed;
    }
    have.erase(it);
  }
  for (const auto& [key, t] : have) {
    report("tensor '" + key + "' is not in the manifest " + manifest_path, "", key);
    ++out.added;
  }
  return out;
}

}  // namespace ckpt::check
