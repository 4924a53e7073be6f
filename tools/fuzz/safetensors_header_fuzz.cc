// libFuzzer target for the safetensors header: length prefix, JSON, dtypes,
// shapes and offsets validated as the spec demands (no holes, no overlaps,
// inside the file). Any input must parse or be refused with a ckpt::Error;
// crashes, sanitizer reports and other exceptions are bugs.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "formats/safetensors/safetensors_format.h"
#include "fuzz_oracle.h"
#include "io/byte_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto source = ckpt::make_memory_source(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    if (!ckpt::safetensors::looks_like_safetensors(*source)) return 0;
    uint64_t data_start = 0;
    ckpt::safetensors::read_header(*source, data_start);
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
  return 0;
}
