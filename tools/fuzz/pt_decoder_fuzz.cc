// libFuzzer target for the torch.save decoder: a whole archive (zip, data.pkl
// under the safe policy, tensor rebuilds, ShardedTensor/DTensor values) then
// the gate every reader's output passes (plain values, bounded expansion) and
// the coverage checks. Any input must decode or be refused with a
// ckpt::Error; crashes, sanitizer reports and other exceptions are bugs.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/torch_pt/pt_reader.h"
#include "fuzz_oracle.h"
#include "io/byte_source.h"
#include "model/plain_values.h"
#include "model/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ckpt::CheckpointModel model;
    model.root = ckpt::torch_pt::decode_archive(
        ckpt::make_memory_source(std::string(reinterpret_cast<const char*>(data), size), "fuzz"), model.tensors);
    if (model.root) {
      ckpt::require_plain_values(*model.root);
      ckpt::require_bounded_expansion(*model.root);
    }
    ckpt::ProblemSink sink;
    ckpt::check_model(model, sink);
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
  return 0;
}
