// libFuzzer target for the DeepSpeed universal-checkpoint reader: the input
// is up to 40 records, each a kind byte, a 4-byte little-endian length and
// the bytes of one file of a tag folder (kind 0: mp_rank_00_model_states.pt;
// 1: zero/optimizer_state.pt; 2: the next zero_pp_rank_{r}_mp_rank_00_model_states.pt;
// 3: a file zero/<name>.pt whose record starts with a length byte and
// <name>, e.g. "l1.weight/fp32"; a name with "..", a leading '/' or more
// than one '/' is skipped), read as one checkpoint (the folder, every
// file's decode, shapes from param_shapes, ZeRO-3 fragments, the gate and
// the coverage checks). Seeds: the universal checkpoints of testdata/ucp
// (scripts/fuzz).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz_files.h"

namespace {

// "<param>/<key>": one folder below zero/, one file in it.
bool plain_name(const std::string& name) {
  const auto slash = name.find('/');
  return !name.empty() && name.find("..") == std::string::npos && name.find('\0') == std::string::npos &&
         slash != std::string::npos && slash > 0 && slash + 1 < name.size() &&
         name.find('/', slash + 1) == std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::fuzz::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/zero");
  std::size_t pos = 0, n = 0;
  const uint8_t* bytes = nullptr;
  int ranks = 0, records = 0;
  while (records < 40 && pos < size) {
    const uint8_t kind = data[pos++] % 4;
    if (!ckpt::fuzz::next_record(data, size, pos, bytes, n)) break;
    ++records;
    std::string name;
    if (kind == 0) {
      name = "mp_rank_00_model_states.pt";
    } else if (kind == 1) {
      name = "zero/optimizer_state.pt";
    } else if (kind == 2) {
      name = "zero_pp_rank_" + std::to_string(ranks++) + "_mp_rank_00_model_states.pt";
    } else {
      if (n == 0 || bytes[0] > n - 1) continue;
      std::string file(reinterpret_cast<const char*>(bytes) + 1, bytes[0]);
      if (!plain_name(file)) continue;
      name = "zero/" + file + ".pt";
      std::filesystem::create_directories(std::filesystem::path(dir.path() + "/" + name).parent_path());
      n -= 1u + bytes[0];
      bytes += 1u + bytes[0];
    }
    dir.write(name, bytes, n);
  }
  if (records > 0) ckpt::fuzz::read_as_checkpoint(dir.path());
  return 0;
}
