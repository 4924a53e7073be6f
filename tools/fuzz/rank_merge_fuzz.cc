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
  std::size_t pos = 0, n = 0;
  const uint8_t* bytes = nullptr;
  int rank = 0;
  while (rank < 4 && ckpt::fuzz::next_record(data, size, pos, bytes, n))
    dir.write("model_rank" + std::to_string(rank++) + ".pt", bytes, n);
  if (rank > 0) ckpt::fuzz::read_as_checkpoint(dir.path());
  return 0;
}
