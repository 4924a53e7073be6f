// CRC-32 (the zip/zlib polynomial 0xEDB88320, APPNOTE 4.4.7) through zlib.
#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "archive/zip_writer.h"

namespace ckpt::archive {

static_assert(sizeof(z_off_t) == 8, "crc32_combine needs 64-bit lengths");

uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n) {
  // zlib takes a 32-bit length (uInt); feed bigger buffers in slices.
  constexpr std::size_t kMaxSlice = std::size_t{1} << 30;
  const auto* bytes = static_cast<const Bytef*>(data);
  uLong value = crc;
  while (n > 0) {
    std::size_t slice = std::min(n, kMaxSlice);
    value = ::crc32(value, bytes, static_cast<uInt>(slice));
    bytes += slice;
    n -= slice;
  }
  return static_cast<uint32_t>(value);
}

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

}  // namespace ckpt::archive
