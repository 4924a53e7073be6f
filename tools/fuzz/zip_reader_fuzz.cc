// libFuzzer target for the zip reader: any input must either parse (and then
// every entry reads and verifies or is refused) or be refused with a
// ckpt::Error; crashes, sanitizer reports and other exceptions are bugs.
// Seed it with real archives, e.g. tests/archive/data/torch_small.pt.
#include <cstddef>
#include <cstdint>
#include <string>

#include "archive/zip_reader.h"
#include "core/error.h"
#include "fuzz_oracle.h"
#include "io/byte_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ckpt::archive::ZipReader zip(
        ckpt::make_memory_source(std::string(reinterpret_cast<const char*>(data), size), "fuzz"));
    for (const ckpt::archive::ZipEntry& entry : zip.entries()) {
      try {
        zip.read(entry);
        zip.verify_crc(entry);
      } catch (const ckpt::Error& e) {
        ckpt::fuzz::refused(e);
      }
    }
    zip.find_record("data.pkl");
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
  return 0;
}
