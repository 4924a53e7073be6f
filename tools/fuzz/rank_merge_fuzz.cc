// libFuzzer target for the merge of a family of per-rank FSDP files: the
// input is up to 4 files, each a 4-byte little-endian length then that many
// bytes, written as model_rank0.pt, model_rank1.pt, ... and read as one
// checkpoint (detection, each rank's decode, the merge of their shards, the
// gate and the coverage checks). Seeds: the rank files of testdata/fsdp_st.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "formats/detect.h"
#include "fuzz_files.h"
#include "model/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::fuzz::TempDir dir;
  std::size_t pos = 0;
  int rank = 0;
  while (rank < 4 && size - pos >= 4) {
    uint32_t n = uint32_t{data[pos]} | uint32_t{data[pos + 1]} << 8 | uint32_t{data[pos + 2]} << 16 |
                 uint32_t{data[pos + 3]} << 24;
    pos += 4;
    if (n > size - pos) n = static_cast<uint32_t>(size - pos);
    dir.write("model_rank" + std::to_string(rank++) + ".pt", data + pos, n);
    pos += n;
  }
  if (rank == 0) return 0;
  try {
    ckpt::CheckpointModel model = ckpt::read_checkpoint(dir.path());
    ckpt::ProblemSink sink;
    ckpt::check_model(model, sink);
  } catch (const ckpt::Error&) {
  }
  return 0;
}
