#include "formats/probe.h"

#include "formats/registry.h"
#include "model/source_info.h"

namespace ckpt {
namespace {

// The registered format whose probe answers highest for `probe`, or null
// when none recognises the source. On a tie the first registered wins.
template <typename Probe>
const InputFormat* best_format(Probe probe) {
  const InputFormat* best = nullptr;
  int best_confidence = confidence::kNo;
  for (const InputFormat* f : input_formats()) {
    int c = probe(*f);
    if (c > best_confidence) {
      best = f;
      best_confidence = c;
    }
  }
  return best;
}

const InputFormat* directory_format(const std::string& dir) {
  return best_format([&](const InputFormat& f) { return f.probe_directory ? f.probe_directory(dir) : 0; });
}

}  // namespace

std::optional<SourceKind> file_kind(const std::string& path, const ByteSource& file) {
  auto probe = [&](const InputFormat& f) { return f.probe_file ? f.probe_file(path, file) : 0; };
  if (const InputFormat* format = best_format(probe)) return format->kind;
  return std::nullopt;
}

std::optional<SourceKind> directory_kind(const std::string& dir) {
  if (const InputFormat* f = directory_format(dir)) return f->kind;
  return std::nullopt;
}

std::string directory_shapes() {
  std::string out;
  for (const InputFormat* f : input_formats())
    if (!f->directory_shape.empty())
      out += std::string(out.empty() ? "no " : ", no ") + std::string(f->directory_shape);
  return out;
}

std::string file_kinds() {
  std::string out;
  for (const InputFormat* f : input_formats())
    if (f->probe_file) out += std::string(out.empty() ? "" : ", ") + source_kind_name(f->kind);
  return out;
}

}  // namespace ckpt
