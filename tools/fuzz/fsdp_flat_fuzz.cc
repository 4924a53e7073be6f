// libFuzzer target for FSDP1 flat parameters (formats/fsdp_flat): the input
// is up to 16 records, each a kind byte, a 4-byte little-endian length and
// the bytes of one file (kind 0: layout.pt, the --param-layout file; 1: the
// next model_rank{r}.pt, a LOCAL_STATE_DICT; 2: the next optim_rank{r}.pt, a
// raw optim.state_dict()), read as one checkpoint with --param-layout
// (units, alignment, every rank's shard and optimizer slice checked), then
// the gate and the coverage checks. Seeds: the jobs of testdata/fsdp1
// (scripts/fuzz).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::fuzz::TempDir dir;
  std::size_t pos = 0, n = 0;
  const uint8_t* bytes = nullptr;
  int models = 0, optims = 0, records = 0;
  while (records < 16 && pos < size) {
    const uint8_t kind = data[pos++] % 3;
    if (!ckpt::fuzz::next_record(data, size, pos, bytes, n)) break;
    ++records;
    const std::string name = kind == 0   ? std::string("layout.pt")
                             : kind == 1 ? "model_rank" + std::to_string(models++) + ".pt"
                                         : "optim_rank" + std::to_string(optims++) + ".pt";
    dir.write(name, bytes, n);
  }
  if (records == 0) return 0;
  try {
    ckpt::ReadOptions options;
    options.param_layout = dir.path() + "/layout.pt";
    ckpt::CheckpointModel model = ckpt::read_checkpoint(dir.path(), options);
    ckpt::ProblemSink sink;
    ckpt::check_model(model, sink);
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
  return 0;
}
