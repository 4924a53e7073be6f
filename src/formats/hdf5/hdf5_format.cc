// HDF5 files (as ckptconv writes them: docs/hdf5-layout.md).
#include "formats/hdf5/hdf5_reader.h"
#include "formats/input_format.h"

namespace ckpt::hdf5 {
namespace {

int probe_file(const std::string&, const ByteSource& file) {
  static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  return file.size() >= 8 && file.read_string(0, 8) == std::string(kSignature, 8) ? confidence::kMarker
                                                                                  : confidence::kNo;
}

CheckpointModel read(const std::string& src, const ReadOptions&) { return read_hdf5_file(src); }

}  // namespace

const InputFormat& input_format() {
  static const InputFormat f{
      .kind = SourceKind::kHdf5, .probe_file = probe_file, .read = read, .description = "an .h5/.hdf5 file"};
  return f;
}

}  // namespace ckpt::hdf5
