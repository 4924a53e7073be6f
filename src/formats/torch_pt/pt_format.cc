// torch.save files: the zip format (torch >= 1.6) and the legacy one.
#include "formats/input_format.h"
#include "formats/torch_pt/pt_reader.h"

namespace ckpt::torch_pt {
namespace {

int probe_file(const std::string&, const ByteSource& file) {
  return is_torch_zip(file) || is_legacy_torch_save(file) ? confidence::kMarker : confidence::kNo;
}

CheckpointModel read(const std::string& src, const ReadOptions& options) { return read_pt_file(src, options.problems); }

}  // namespace

const InputFormat& input_format() {
  static const InputFormat f{.kind = SourceKind::kTorchPt,
                             .probe_file = probe_file,
                             .read = read,
                             .description = "a .pt/.pth/.bin file (zip or legacy format)"};
  return f;
}

}  // namespace ckpt::torch_pt
