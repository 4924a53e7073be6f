#include <zlib.h>
#include <catch2/catch.hpp>

#include <string>

#include "archive/zip_reader.h"
#include "archive/zip_writer.h"
#include "core/error.h"
#include "io/byte_sink.h"

using namespace ckpt;
using namespace ckpt::archive;

// Records of more than one 64 MiB slice are summed in parts on several
// threads and the parts joined with crc32_combine: the result must be the
// CRC-32 of the whole, and a flipped byte in any part must be found.
TEST_CASE("a record spanning several CRC slices verifies, and a flip in its last part is found", "[archive]") {
  const std::size_t size = (std::size_t{64} << 20) * 2 + 12345;
  std::string payload(size, '\0');
  for (std::size_t i = 0; i < size; i += 4096) payload[i] = static_cast<char>(i / 4096);
  MemorySink sink;
  {
    ZipWriter zip(sink);
    zip.write_record("data/0", payload);
    zip.finish();
  }
  std::string bytes = sink.take();
  std::size_t at = 0;
  {
    ZipReader zip(make_memory_source(bytes, "big.pt"));
    CHECK(zip.record("data/0").crc32 == crc32_update(0, payload.data(), payload.size()));
    CHECK_NOTHROW(zip.verify_crc(zip.record("data/0")));
    at = static_cast<std::size_t>(zip.record("data/0").data_offset) + size - 7;
  }
  payload.clear();
  payload.shrink_to_fit();
  bytes[at] ^= 0x01;
  ZipReader zip(make_memory_source(std::move(bytes), "big.pt"));
  CHECK_THROWS_WITH(zip.verify_crc(zip.record("data/0")), Catch::Contains("CRC-32 mismatch"));
}

// crc32_update folds 16-byte blocks with PCLMULQDQ where the CPU has it and
// leaves the tail to zlib: every length, alignment and starting CRC must give
// zlib's own answer.
TEST_CASE("crc32_update equals zlib's crc32 for every length, alignment and seed", "[archive]") {
  std::string data(70000, '\0');
  uint64_t state = 88172645463325252ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (auto& c : data) c = static_cast<char>(next());
  for (int t = 0; t < 3000; ++t) {
    std::size_t off = next() % 64;
    std::size_t len = t < 300 ? static_cast<std::size_t>(t) : next() % (data.size() - 64);
    uint32_t seed = t % 3 == 0 ? 0 : static_cast<uint32_t>(next());
    const auto* p = reinterpret_cast<const Bytef*>(data.data() + off);
    INFO("length " << len << ", offset " << off << ", seed " << seed);
    REQUIRE(crc32_update(seed, p, len) == static_cast<uint32_t>(::crc32(seed, p, static_cast<uInt>(len))));
  }
}
