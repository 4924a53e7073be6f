// libFuzzer target for the HDF5 reader, through the child process every read
// goes through (formats/hdf5/hdf5_reader.h): the input is a .h5 file; its
// structure and the first bytes of each tensor must be read or refused with a
// ckpt::Error. A crash or hang inside libhdf5 is the child's, and a refusal
// here; a signal in this process is a bug. Seeds: .h5 files ckptconv wrote
// (scripts/fuzz).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "formats/hdf5/hdf5_reader.h"
#include "fuzz_files.h"
#include "fuzz_oracle.h"
#include "model/plain_values.h"

namespace {
// A mutant that makes libhdf5 loop is refused after this long. The inputs are
// at most 64 KB, whose structure the child reads in milliseconds; the tool's
// own minute would make every such mutant cost the campaign a minute.
constexpr double kTimeoutS = 1;
constexpr std::size_t kBytesPerTensor = 4096;  // enough to cross rows and chunks of the seeds
}  // namespace

// libhdf5, in the child, allocates what a corrupt size says (7.5 GB for one
// string attribute, or SIZE_MAX); the tool caps the child's address space
// (io/isolate.h), which AddressSanitizer's reservations rule out here. Its
// allocator refuses instead, so libhdf5 sees NULL as it does under the cap,
// rather than the child dying in a sanitizer report.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1:max_allocation_size_mb=1024"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::fuzz::TempDir dir;
  std::string file = dir.write("in.h5", data, size);
  try {
    ckpt::CheckpointModel model = ckpt::hdf5::read_hdf5_file(file, kTimeoutS);
    if (model.root) ckpt::require_bounded_expansion(*model.root);
    std::vector<char> buf(kBytesPerTensor);
    for (const auto& t : model.tensors) {
      const auto& storage = *t.chunks.front().storage;
      storage.read(0, buf.data(), static_cast<std::size_t>(std::min<uint64_t>(storage.size(), buf.size())));
    }
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
  return 0;
}
