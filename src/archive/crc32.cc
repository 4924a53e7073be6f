// CRC-32 (the zip/zlib polynomial 0xEDB88320, APPNOTE 4.4.7). On x86-64
// with PCLMULQDQ, whole 16-byte blocks are folded with carry-less multiplies
// (Gopal et al., "Fast CRC Computation for Generic Polynomials Using
// PCLMULQDQ Instruction", Intel 2009; the constants and steps of Chromium
// zlib's crc32_sse42_simd_): ~3x zlib's table-driven CRC, which at 1-2 GB/s
// was the bottleneck of validate and of the zip writer. The tail, and every
// CPU without the instruction, goes through zlib; unit tests compare both.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "archive/zip_writer.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/parallel_ranges.h"

namespace ckpt::archive {
namespace {

// zlib's CRC over any length, sliced for its 32-bit length argument.
uint32_t zlib_crc32(uint32_t crc, const Bytef* bytes, std::size_t n) {
  constexpr std::size_t kMaxSlice = std::size_t{1} << 30;
  uLong value = crc;
  while (n > 0) {
    std::size_t slice = std::min(n, kMaxSlice);
    value = ::crc32(value, bytes, static_cast<uInt>(slice));
    bytes += slice;
    n -= slice;
  }
  return static_cast<uint32_t>(value);
}

#if defined(__x86_64__)
__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_finish(__m128i x1, __m128i x2, __m128i x3, __m128i x4,
                                                               const unsigned char* buf, size_t len);

// Folds len bytes (len >= 64, a multiple of 16) into the CRC register value
// `crc` (the inverted CRC, as zlib keeps it internally).
__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_fold(uint32_t crc, const unsigned char* buf, size_t len) {
  alignas(16) static const uint64_t k1k2[2] = {0x0154442bd4, 0x01c6e41596};
  __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;
  x1 = _mm_loadu_si128((const __m128i*)(buf + 0x00));
  x2 = _mm_loadu_si128((const __m128i*)(buf + 0x10));
  x3 = _mm_loadu_si128((const __m128i*)(buf + 0x20));
  x4 = _mm_loadu_si128((const __m128i*)(buf + 0x30));
  x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128(static_cast<int>(crc)));
  x0 = _mm_load_si128((const __m128i*)k1k2);
  buf += 64;
  len -= 64;
  while (len >= 64) {
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
    x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
    x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
    x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
    y5 = _mm_loadu_si128((const __m128i*)(buf + 0x00));
    y6 = _mm_loadu_si128((const __m128i*)(buf + 0x10));
    y7 = _mm_loadu_si128((const __m128i*)(buf + 0x20));
    y8 = _mm_loadu_si128((const __m128i*)(buf + 0x30));
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
    x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
    x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
    x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
    buf += 64;
    len -= 64;
  }
  return crc32_finish(x1, x2, x3, x4, buf, len);
}

// Folds 64 bytes held in x1..x4 (consecutive 16-byte lanes) and then the
// rest of buf (len bytes, a multiple of 16) down to the CRC register.
__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_finish(__m128i x1, __m128i x2, __m128i x3, __m128i x4,
                                                               const unsigned char* buf, size_t len) {
  alignas(16) static const uint64_t k3k4[2] = {0x01751997d0, 0x00ccaa009e};
  alignas(16) static const uint64_t k5k0[2] = {0x0163cd6124, 0x0000000000};
  alignas(16) static const uint64_t poly[2] = {0x01db710641, 0x01f7011641};
  __m128i x0, x5;
  x0 = _mm_load_si128((const __m128i*)k3k4);
  x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
  x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
  x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
  x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
  x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
  x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
  while (len >= 16) {
    x2 = _mm_loadu_si128((const __m128i*)buf);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    buf += 16;
    len -= 16;
  }
  x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
  x3 = _mm_setr_epi32(~0, 0, ~0, 0);
  x1 = _mm_srli_si128(x1, 8);
  x1 = _mm_xor_si128(x1, x2);
  x0 = _mm_loadl_epi64((const __m128i*)k5k0);
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_and_si128(x1, x3);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_xor_si128(x1, x2);
  x0 = _mm_load_si128((const __m128i*)poly);
  x2 = _mm_and_si128(x1, x3);
  x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
  x2 = _mm_and_si128(x2, x3);
  x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
  x1 = _mm_xor_si128(x1, x2);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

bool have_pclmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}

// The same folding on 512-bit registers (VPCLMULQDQ): four of them, 256
// bytes per step, each 128-bit lane folded as above, with the constants for
// a 2048-bit distance (x^(2048+32) and x^(2048-32) mod P, bit-reflected and
// shifted as k1 and k2 are for 512 bits); then the four fold into one
// (512-bit distance: k1, k2), and its four lanes are the x1..x4 the 128-bit
// code finishes. About 3x the 128-bit loop, which ran at ~6 GB/s per core,
// below what the page cache delivers to validate.
#define CKPT_TARGET_512 __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.1")))

// x folded over the distance k is for, xor'ed with the next block.
CKPT_TARGET_512 inline __m512i fold(__m512i x, __m512i k, __m512i next) {
  __m512i lo = _mm512_clmulepi64_epi128(x, k, 0x00);
  __m512i hi = _mm512_clmulepi64_epi128(x, k, 0x11);
  return _mm512_ternarylogic_epi64(lo, hi, next, 0x96);  // lo ^ hi ^ next
}

CKPT_TARGET_512 uint32_t crc32_fold_512(uint32_t crc, const unsigned char* buf, size_t len) {
  const __m512i k2048 = _mm512_set_epi64(0x01322d1430, 0x011542778a, 0x01322d1430, 0x011542778a, 0x01322d1430,
                                         0x011542778a, 0x01322d1430, 0x011542778a);
  const __m512i k512 = _mm512_set_epi64(0x01c6e41596, 0x0154442bd4, 0x01c6e41596, 0x0154442bd4, 0x01c6e41596,
                                        0x0154442bd4, 0x01c6e41596, 0x0154442bd4);
  __m512i x1 = _mm512_loadu_si512(buf), x2 = _mm512_loadu_si512(buf + 64);
  __m512i x3 = _mm512_loadu_si512(buf + 128), x4 = _mm512_loadu_si512(buf + 192);
  x1 = _mm512_xor_si512(x1, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  buf += 256;
  len -= 256;
  while (len >= 256) {
    x1 = fold(x1, k2048, _mm512_loadu_si512(buf));
    x2 = fold(x2, k2048, _mm512_loadu_si512(buf + 64));
    x3 = fold(x3, k2048, _mm512_loadu_si512(buf + 128));
    x4 = fold(x4, k2048, _mm512_loadu_si512(buf + 192));
    buf += 256;
    len -= 256;
  }
  x1 = fold(x1, k512, x2);
  x1 = fold(x1, k512, x3);
  x1 = fold(x1, k512, x4);
  while (len >= 64) {
    x1 = fold(x1, k512, _mm512_loadu_si512(buf));
    buf += 64;
    len -= 64;
  }
  alignas(64) __m128i lanes[4];
  _mm512_store_si512(lanes, x1);
  return crc32_finish(lanes[0], lanes[1], lanes[2], lanes[3], buf, len);
}

bool have_vpclmul() {
  static const bool yes = have_pclmul() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("vpclmulqdq");
  return yes;
}
#endif

}  // namespace

static_assert(sizeof(z_off_t) == 8, "crc32_combine needs 64-bit lengths");

uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n) {
  const auto* bytes = static_cast<const Bytef*>(data);
#if defined(__x86_64__)
  if (n >= 256 && have_vpclmul()) {
    std::size_t blocks = n & ~std::size_t{15};
    crc = ~crc32_fold_512(~crc, bytes, blocks);
    bytes += blocks;
    n -= blocks;
  } else if (n >= 64 && have_pclmul()) {
    std::size_t blocks = n & ~std::size_t{15};
    crc = ~crc32_fold(~crc, bytes, blocks);
    bytes += blocks;
    n -= blocks;
  }
#endif
  return zlib_crc32(crc, bytes, n);
}

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

}  // namespace ckpt::archive

namespace ckpt::archive {
namespace {

// Bytes read per step: small enough to stay in cache between the read and
// the sum, large enough that the syscalls do not show.
constexpr std::size_t kCrcStep = std::size_t{256} << 10;
// A source with neither a file nor a mapping behind it (an s3:// object)
// pays a request per read, not a syscall: there, 16x fewer, larger reads
// (the size of ByteSink's read-through copies).
constexpr std::size_t kRemoteCrcStep = std::size_t{4} << 20;

}  // namespace

uint32_t crc32_of(const ByteSource& src, int threads) {
  const uint64_t size = src.size();
  int parts = useful_threads(size, threads);
  std::vector<uint32_t> crcs(static_cast<std::size_t>(parts));
  std::vector<uint64_t> lengths(static_cast<std::size_t>(parts));
  const std::size_t step = size == 0 || src.data() || src.file_span(0) ? kCrcStep : kRemoteCrcStep;
  for_each_range(static_cast<int64_t>(size), parts, [&](int p, int64_t begin, int64_t end) {
    std::vector<std::byte> buffer;
    uint32_t crc = 0;
    for (auto pos = static_cast<uint64_t>(begin); pos < static_cast<uint64_t>(end);) {
      auto n = static_cast<std::size_t>(std::min<uint64_t>(step, static_cast<uint64_t>(end) - pos));
      buffer.resize(n);
      src.read_unmapped(pos, buffer.data(), n);
      crc = crc32_update(crc, buffer.data(), n);
      pos += n;
      check_interrupted();
    }
    crcs[static_cast<std::size_t>(p)] = crc;
    lengths[static_cast<std::size_t>(p)] = static_cast<uint64_t>(end - begin);
  });
  uint32_t crc = crcs.empty() ? 0 : crcs[0];
  for (std::size_t p = 1; p < crcs.size(); ++p) crc = crc32_combine(crc, crcs[p], lengths[p]);
  return crc;
}

}  // namespace ckpt::archive
