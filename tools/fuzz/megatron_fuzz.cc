// libFuzzer target for Megatron-core torch_dist directories
// (formats/megatron): the input is up to 24 records, each a kind byte, a
// 4-byte little-endian length and the bytes of one file (kind 0:
// metadata.json; 1: .metadata, the DCP metadata pickle with megatron-core's
// save plans; 2: common.pt; 3: a .distcp file whose record starts with two
// bytes r and n, written as __<r>_<n>.distcp). The directory is read as
// one checkpoint (detection, sharded objects grouped and their coverage,
// common.pt under the quarantine, the gate and coverage checks), then in
// each --only view (layers and experts unstacked; the optimizer's state by
// name, chained or not), fail-fast and under validate's problem sink.
// Seeds: the jobs of testdata/megatron (scripts/fuzz).
#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/megatron/megatron_reader.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::fuzz::TempDir dir;
  std::size_t pos = 0, n = 0;
  const uint8_t* bytes = nullptr;
  int records = 0;
  while (records < 24 && pos < size) {
    const uint8_t kind = data[pos++] % 4;
    if (!ckpt::fuzz::next_record(data, size, pos, bytes, n)) break;
    ++records;
    std::string name = kind == 0 ? "metadata.json" : kind == 1 ? ".metadata" : "common.pt";
    if (kind == 3) {
      if (n < 2) continue;
      name = "__" + std::to_string(bytes[0] % 8) + "_" + std::to_string(bytes[1] % 4) + ".distcp";
      bytes += 2;
      n -= 2;
    }
    dir.write(name, bytes, n);
  }
  if (records == 0) return 0;
  ckpt::fuzz::read_as_checkpoint(dir.path());
  for (const char* only : {"model", "optim"}) {
    try {
      ckpt::megatron::read_torch_dist(dir.path(), nullptr, only);
    } catch (const ckpt::Error& e) {
      ckpt::fuzz::refused(e);
    }
    try {
      ckpt::ProblemSink sink;
      ckpt::megatron::read_torch_dist(dir.path(), &sink, only);
    } catch (const ckpt::Error& e) {
      ckpt::fuzz::refused(e);
    }
  }
  return 0;
}
