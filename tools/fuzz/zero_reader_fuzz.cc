// libFuzzer target for the DeepSpeed ZeRO reader: the input is up to 8
// records, each a kind byte, a 4-byte little-endian length and the bytes of
// one file of a tag directory (kind 0: mp_rank_00_model_states.pt; 1: the
// next zero_pp_rank_{r}_mp_rank_00_model_states.pt; 2: the next
// zero_pp_rank_{r}_mp_rank_00_optim_states.pt), read as one checkpoint (file
// set, every rank's decode, the partition layout, the gate and the coverage
// checks). Seeds: the cases of testdata/zero (scripts/fuzz).
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
  int model_ranks = 0, optim_ranks = 0, records = 0;
  while (records < 8 && pos < size) {
    uint8_t kind = data[pos++] % 3;
    if (!ckpt::fuzz::next_record(data, size, pos, bytes, n)) break;
    std::string name = kind == 0   ? "mp_rank_00_model_states.pt"
                       : kind == 1 ? "zero_pp_rank_" + std::to_string(model_ranks++) + "_mp_rank_00_model_states.pt"
                                   : "zero_pp_rank_" + std::to_string(optim_ranks++) + "_mp_rank_00_optim_states.pt";
    dir.write(name, bytes, n);
    ++records;
  }
  if (records > 0) ckpt::fuzz::read_as_checkpoint(dir.path());
  return 0;
}
