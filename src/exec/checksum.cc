#include "exec/checksum.h"

#include <openssl/evp.h>
#include <xxhash.h>
#if defined(__x86_64__)
// Debian's libxxhash is built for baseline x86-64 (SSE2); its dispatching
// entry points pick AVX2/AVX-512 at run time, 3-4x faster on this path.
#include <xxh_x86dispatch.h>
#define CKPT_XXH3_UPDATE XXH3_64bits_update_dispatch
#else
#define CKPT_XXH3_UPDATE XXH3_64bits_update
#endif

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/error.h"

namespace ckpt {
namespace {
constexpr std::size_t kSlice = std::size_t{16} << 20;
}  // namespace

const char* checksum_algorithm_name(ChecksumAlgorithm algorithm) {
  return algorithm == ChecksumAlgorithm::kSha256 ? "sha256" : "xxh3-64";
}

std::optional<ChecksumAlgorithm> checksum_algorithm_from_name(std::string_view name) {
  if (name == "xxh3-64") return ChecksumAlgorithm::kXxh3_64;
  if (name == "sha256") return ChecksumAlgorithm::kSha256;
  return std::nullopt;
}

struct Hasher::State {
  ChecksumAlgorithm algorithm;
  XXH3_state_t* xxh = nullptr;
  EVP_MD_CTX* sha = nullptr;
  bool done = false;

  ~State() {
    if (xxh) XXH3_freeState(xxh);
    if (sha) EVP_MD_CTX_free(sha);
  }
};

Hasher::Hasher(ChecksumAlgorithm algorithm) : state_(std::make_unique<State>()) {
  state_->algorithm = algorithm;
  if (algorithm == ChecksumAlgorithm::kXxh3_64) {
    state_->xxh = XXH3_createState();
    if (!state_->xxh || XXH3_64bits_reset(state_->xxh) != XXH_OK)
      fail(ErrorCode::kInternal, "XXH3: cannot start a hash");
  } else {
    state_->sha = EVP_MD_CTX_new();
    if (!state_->sha || EVP_DigestInit_ex(state_->sha, EVP_sha256(), nullptr) != 1)
      fail(ErrorCode::kInternal, "OpenSSL: cannot start a SHA-256 digest");
  }
}

Hasher::~Hasher() = default;

void Hasher::update(const void* data, std::size_t n) {
  if (state_->done) fail(ErrorCode::kInternal, "Hasher::update after hex_digest");
  if (n == 0) return;
  if (state_->xxh) {
    CKPT_XXH3_UPDATE(state_->xxh, data, n);
  } else if (EVP_DigestUpdate(state_->sha, data, n) != 1) {
    fail(ErrorCode::kInternal, "OpenSSL: SHA-256 update failed");
  }
}

std::string Hasher::hex_digest() {
  if (state_->done) fail(ErrorCode::kInternal, "Hasher::hex_digest called twice");
  state_->done = true;
  char buf[2 * EVP_MAX_MD_SIZE + 1];
  if (state_->xxh) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(state_->xxh)));
    return buf;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(state_->sha, md, &len) != 1) fail(ErrorCode::kInternal, "OpenSSL: SHA-256 final failed");
  for (unsigned int i = 0; i < len; ++i) std::snprintf(buf + 2 * i, 3, "%02x", md[i]);
  return std::string(buf, 2 * len);
}

std::string checksum_source(const ByteSource& source, ChecksumAlgorithm algorithm) {
  Hasher hasher(algorithm);
  uint64_t size = source.size();
  const std::byte* mapped = source.data();
  std::vector<std::byte> buffer;
  if (!mapped) buffer.resize(static_cast<std::size_t>(std::min<uint64_t>(size, kSlice)));
  for (uint64_t pos = 0; pos < size;) {
    auto n = static_cast<std::size_t>(std::min<uint64_t>(size - pos, kSlice));
    if (mapped) {
      hasher.update(mapped + pos, n);
      source.release(pos, n);
    } else {
      source.read(pos, buffer.data(), n);
      hasher.update(buffer.data(), n);
    }
    pos += n;
  }
  return hasher.hex_digest();
}

}  // namespace ckpt
