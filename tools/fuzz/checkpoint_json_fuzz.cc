// libFuzzer target for every JSON a checkpoint carries, each through the
// reader that consumes it: the first byte picks the consumer, the rest is
// the JSON text.
//   0: the shared parse alone (model/ordered_json.h: parse_checkpoint_json
//      and the member index every reader looks members up through)
//   1: a safetensors index (model.safetensors.index.json) beside one shard
//      holding "w" and "b"
//   2: megatron-core's metadata.json beside an empty DCP directory
//   3: DCP_SHARDING_INFO in the __metadata__ of a DCP-HF rank file holding "w"
// Any input must be read or refused with a ckpt::Error; crashes,
// sanitizer reports and other exceptions are bugs.
// Seeds: the indexes, metadata.json files and DCP_SHARDING_INFO texts of
// testdata (scripts/fuzz).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_files.h"
#include "model/ordered_json.h"

namespace {

// A safetensors file holding `tensors` (name -> 4 float32 zeros each) whose
// __metadata__ is `metadata`.
std::string safetensors_file(const std::vector<std::string>& tensors, const nlohmann::json& metadata) {
  nlohmann::json header = {{"__metadata__", metadata}};
  uint64_t at = 0;
  for (const auto& name : tensors) {
    header[name] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {at, at + 16}}};
    at += 16;
  }
  std::string h = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h + std::string(at, '\0');
}

void write_text(const ckpt::fuzz::TempDir& dir, const std::string& name, const std::string& text) {
  dir.write(name, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      try {
        nlohmann::ordered_json j = ckpt::parse_checkpoint_json(text, "fuzz");
        if (j.is_object()) ckpt::JsonMembers(j, "fuzz");
      } catch (const ckpt::Error& e) {
        ckpt::fuzz::refused(e);
      }
      return 0;
    case 1: {
      ckpt::fuzz::TempDir dir;
      write_text(dir, "model-00001-of-00001.safetensors", safetensors_file({"w", "b"}, {{"format", "pt"}}));
      write_text(dir, "model.safetensors.index.json", text);
      ckpt::fuzz::read_as_checkpoint(dir.path() + "/model.safetensors.index.json");
      ckpt::fuzz::read_as_checkpoint(dir.path());
      return 0;
    }
    case 2: {
      ckpt::fuzz::TempDir dir;
      write_text(dir, "metadata.json", text);
      ckpt::fuzz::read_as_checkpoint(dir.path());
      return 0;
    }
    default: {
      ckpt::fuzz::TempDir dir;
      write_text(dir, "shard-00001-model-00001-of-00001.safetensors",
                 safetensors_file({"w"}, {{"DCP_SHARDING_INFO", text}, {"DCP_VERSION", "1.0"}}));
      ckpt::fuzz::read_as_checkpoint(dir.path());
      return 0;
    }
  }
}
