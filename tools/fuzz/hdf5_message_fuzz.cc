// libFuzzer target for what this process parses of an HDF5 input: the
// structure message the reader's child sends (formats/hdf5/hdf5_structure.h).
// libhdf5 reads the file only in that child; a child whose heap a corrupt
// file damaged can send any bytes, so the message must be read or refused
// with a ckpt::Error, and the model it gives must be sound: every tensor
// reference names a tensor, its tree expands within the budget. Seeds:
// messages the child sent for the .h5 fixtures (scripts/fuzz).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"
#include "formats/hdf5/hdf5_structure.h"
#include "fuzz_oracle.h"
#include "model/plain_values.h"
#include "model/tree_walk.h"

namespace {

// Stands in for the child's bytes: the size the message declared, no reads.
class NoBytes final : public ckpt::ByteSource {
 public:
  explicit NoBytes(uint64_t size) : size_(size) {}
  uint64_t size() const override { return size_; }
  void read(uint64_t, void*, std::size_t) const override {}
  std::string describe() const override { return "fuzz"; }

 private:
  uint64_t size_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ckpt::CheckpointModel model = ckpt::hdf5::model_from_structure(
        std::string(reinterpret_cast<const char*>(data), size), "in.h5",
        [](std::size_t, uint64_t nbytes, const std::string&) { return std::make_shared<NoBytes>(nbytes); });
    // A small bound: the walk below visits the expanded tree.
    ckpt::require_bounded_expansion(*model.root, 1 << 16);
    ckpt::walk_leaves(*model.root, [&](const ckpt::Leaf& leaf) {
      if (leaf.tensor && *leaf.tensor >= model.tensors.size()) std::abort();  // a reference to no tensor
    });
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
  return 0;
}
