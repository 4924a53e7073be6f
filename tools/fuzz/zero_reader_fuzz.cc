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
  std::size_t pos = 0;
  int model_ranks = 0, optim_ranks = 0, records = 0;
  while (records < 8 && size - pos >= 5) {
    uint8_t kind = data[pos] % 3;
    uint32_t n = uint32_t{data[pos + 1]} | uint32_t{data[pos + 2]} << 8 | uint32_t{data[pos + 3]} << 16 |
                 uint32_t{data[pos + 4]} << 24;
    pos += 5;
    if (n > size - pos) n = static_cast<uint32_t>(size - pos);
    std::string name = kind == 0   ? "mp_rank_00_model_states.pt"
                       : kind == 1 ? "zero_pp_rank_" + std::to_string(model_ranks++) + "_mp_rank_00_model_states.pt"
                                   : "zero_pp_rank_" + std::to_string(optim_ranks++) + "_mp_rank_00_optim_states.pt";
    dir.write(name, data + pos, n);
    pos += n;
    ++records;
  }
  if (records == 0) return 0;
  try {
    ckpt::CheckpointModel model = ckpt::read_checkpoint(dir.path());
    ckpt::ProblemSink sink;
    ckpt::check_model(model, sink);
  } catch (const ckpt::Error&) {
  }
  return 0;
}
