// Streaming checksums for integrity manifests (validate --write-manifest /
// --manifest): XXH3-64 (libxxhash; fast, not cryptographic) or SHA-256
// (OpenSSL EVP; for manifests that must resist tampering, not only rot).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "io/byte_source.h"

namespace ckpt {

enum class ChecksumAlgorithm { kXxh3_64, kSha256 };

// "xxh3-64", "sha256": the names manifests record.
const char* checksum_algorithm_name(ChecksumAlgorithm algorithm);
std::optional<ChecksumAlgorithm> checksum_algorithm_from_name(std::string_view name);

class Hasher {
 public:
  explicit Hasher(ChecksumAlgorithm algorithm);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void update(const void* data, std::size_t n);
  // Lowercase hex of the digest (XXH3-64: 16 digits, the value big-endian as
  // xxhsum prints it; SHA-256: 64 digits). Ends the hasher.
  std::string hex_digest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The checksum of all bytes of `source`, read in bounded slices; mapped
// pages are released as they are done.
std::string checksum_source(const ByteSource& source, ChecksumAlgorithm algorithm);

}  // namespace ckpt
