// The one registration point of input formats: each line names the
// descriptor a format folder defines beside its reader.
#include "formats/registry.h"

#include <string>

#include "core/error.h"

namespace ckpt {

namespace torch_pt {
const InputFormat& input_format();
}
namespace dcp {
const InputFormat& dir_format();
const InputFormat& pair_format();
}  // namespace dcp
namespace fsdp_ranks {
const InputFormat& input_format();
}
namespace zero {
const InputFormat& input_format();
}
namespace safetensors {
const InputFormat& file_format();
const InputFormat& index_format();
const InputFormat& folder_format();
const InputFormat& bin_folder_format();
}  // namespace safetensors
namespace dcp_hf {
const InputFormat& input_format();
}
namespace ds_universal {
const InputFormat& input_format();
}
namespace megatron {
const InputFormat& input_format();
}
namespace megatron_legacy {
const InputFormat& input_format();
}
#ifdef CKPT_HAVE_HDF5
namespace hdf5 {
const InputFormat& input_format();
}
#endif

namespace {

#ifndef CKPT_HAVE_HDF5
// Built without HDF5: an HDF5 file is still recognised, and refused saying why.
const InputFormat& hdf5_unavailable() {
  static const InputFormat f{
      .kind = SourceKind::kHdf5,
      .probe_file =
          [](const std::string&, const ByteSource& file) {
            static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
            return file.size() >= 8 && file.read_string(0, 8) == std::string(kSignature, 8) ? confidence::kMarker
                                                                                            : confidence::kNo;
          },
      .read = [](const std::string& src, const ReadOptions&) -> CheckpointModel {
        fail(ErrorCode::kUnimplemented, src + ": this ckptconv was built without HDF5 (CKPT_WITH_HDF5=OFF)");
      },
      .description = "an .h5/.hdf5 file (not read by this build: CKPT_WITH_HDF5=OFF)"};
  return f;
}
#endif

}  // namespace

const std::vector<const InputFormat*>& input_formats() {
  static const std::vector<const InputFormat*> formats = {
      &torch_pt::input_format(),
      &dcp::dir_format(),
      &dcp::pair_format(),
      &fsdp_ranks::input_format(),
      &zero::input_format(),
      &safetensors::file_format(),
      &safetensors::index_format(),
      &safetensors::folder_format(),
      &dcp_hf::input_format(),
      &ds_universal::input_format(),
      &megatron::input_format(),
      &safetensors::bin_folder_format(),
      &megatron_legacy::input_format(),
#ifdef CKPT_HAVE_HDF5
      &hdf5::input_format(),
#else
      &hdf5_unavailable(),
#endif
  };
  return formats;
}

const InputFormat& input_format(SourceKind kind) {
  for (const InputFormat* f : input_formats())
    if (f->kind == kind) return *f;
  fail(ErrorCode::kInternal, std::string("no input format registered for ") + source_kind_name(kind));
}

const SourceTraits& source_traits(SourceKind kind) { return input_format(kind).traits; }

}  // namespace ckpt
