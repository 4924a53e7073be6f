// libFuzzer target for Megatron-LM legacy (ckpt_format=torch) folders
// (formats/megatron_legacy): the input is up to 16 records, each a kind byte,
// a 4-byte little-endian length and the bytes of one file (kind 0: the
// tracker latest_checkpointed_iteration.txt; 1: a rank file whose record
// starts with two bytes t and p, written as
// iter_0000001/mp_rank_<t:02d>[_<p:03d>]/model_optim_rng.pt, the pipeline
// part present when p is below 4; 2: the same for the distributed
// optimizer's distrib_optim.pt beside it). The root is read as a checkpoint
// (tracker, detection, the TP/PP merge, coverage), then the iteration
// folder in each view (the optimizer's by parameter name included),
// fail-fast and under validate's problem sink.
// Seeds: the jobs of testdata/megatron_legacy (scripts/fuzz).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "formats/megatron_legacy/legacy_reader.h"
#include "formats/megatron_legacy/tp_layout.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::fuzz::TempDir dir;
  const std::string iter = dir.path() + "/iter_0000001";
  std::filesystem::create_directories(iter);
  std::size_t pos = 0, n = 0;
  const uint8_t* bytes = nullptr;
  int records = 0;
  while (records < 16 && pos < size) {
    const uint8_t kind = data[pos++] % 3;
    if (!ckpt::fuzz::next_record(data, size, pos, bytes, n)) break;
    ++records;
    if (kind == 0) {
      dir.write("latest_checkpointed_iteration.txt", bytes, n);
      continue;
    }
    if (n < 2) continue;
    const int tp = bytes[0] % 4, pp = bytes[1] % 8;
    const std::string folder = ckpt::megatron_legacy::rank_folder_name(tp, pp % 4, 0, pp < 4 ? 2 : 1, 1);
    std::filesystem::create_directories(iter + "/" + folder);
    const char* file = kind == 1 ? "/model_optim_rng.pt" : "/distrib_optim.pt";
    dir.write("iter_0000001/" + folder + file, bytes + 2, n - 2);
  }
  if (records == 0) return 0;
  ckpt::fuzz::read_as_checkpoint(dir.path());
  for (const char* only : {"", "model", "optim"}) {
    try {
      ckpt::megatron_legacy::read_legacy(iter, nullptr, only);
    } catch (const ckpt::Error& e) {
      ckpt::fuzz::refused(e);
    }
    try {
      ckpt::ProblemSink sink;
      ckpt::megatron_legacy::read_legacy(iter, &sink, only);
    } catch (const ckpt::Error& e) {
      ckpt::fuzz::refused(e);
    }
  }
  return 0;
}
