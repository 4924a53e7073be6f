#include <catch2/catch.hpp>

#include <string>

#include "exec/checksum.h"

using namespace ckpt;

namespace {
std::string digest(ChecksumAlgorithm a, const std::string& text) {
  Hasher h(a);
  h.update(text.data(), text.size());
  return h.hex_digest();
}
}  // namespace

TEST_CASE("XXH3-64 and SHA-256 give the published digests", "[check]") {
  // xxhsum -H3 of an empty input; SHA-256 of "abc" (FIPS 180-2, appendix B.1).
  CHECK(digest(ChecksumAlgorithm::kXxh3_64, "") == "2d06800538d394c2");
  CHECK(digest(ChecksumAlgorithm::kSha256, "abc") ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("a digest does not depend on how the bytes are split into updates", "[check]") {
  std::string text(100000, '\0');
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(i * 31 + 7);
  for (auto a : {ChecksumAlgorithm::kXxh3_64, ChecksumAlgorithm::kSha256}) {
    Hasher h(a);
    for (std::size_t pos = 0; pos < text.size(); pos += 997)
      h.update(text.data() + pos, std::min<std::size_t>(997, text.size() - pos));
    CHECK(h.hex_digest() == digest(a, text));
    CHECK(checksum_source(*make_memory_source(text), a) == digest(a, text));
  }
  CHECK(digest(ChecksumAlgorithm::kXxh3_64, text) != digest(ChecksumAlgorithm::kXxh3_64, text.substr(1)));
}

TEST_CASE("algorithm names round-trip and unknown names are refused", "[check]") {
  CHECK(checksum_algorithm_from_name("xxh3-64") == ChecksumAlgorithm::kXxh3_64);
  CHECK(checksum_algorithm_from_name("sha256") == ChecksumAlgorithm::kSha256);
  CHECK_FALSE(checksum_algorithm_from_name("md5"));
  CHECK(std::string(checksum_algorithm_name(ChecksumAlgorithm::kSha256)) == "sha256");
}
