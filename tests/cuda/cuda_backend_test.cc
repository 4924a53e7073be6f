// CUDA backend against the CPU backend, bit for bit. Skipped (with the
// reason) where this build has no CUDA or no device is visible; scripts/
// gpu-check runs them on a machine with a GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "../exec/backend_test_util.h"
#include "exec/backend.h"

using namespace ckpt;
using namespace ckpt::testing;

namespace {

// The CUDA backend, or null after a WARN saying why it cannot run here.
std::unique_ptr<Backend> cuda_or_skip() {
  std::unique_ptr<Backend> cuda;
  std::string why = unavailable_reason([&] { cuda = make_backend(Device::kCuda, 0); }, ErrorCode::kInvalidArgument);
  if (!why.empty()) WARN("skipped, no CUDA device: " << why);
  return cuda;
}

// Special and ordinary float32 bit patterns: NaNs with payloads and signs,
// infinities, zeros, subnormals, halfway cases of bfloat16 and half, values
// that overflow half, then a pseudo-random spread.
std::vector<uint32_t> float32_patterns(std::size_t n) {
  std::vector<uint32_t> v = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FA00000u, 0xFFFFFFFFu, 0x7F800000u,
                             0xFF800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x3F808000u,
                             0x3F818000u, 0x3F801000u, 0x3F803000u, 0x477FF000u, 0x477FEFFFu, 0x477FE000u,
                             0x33000000u, 0x33000001u, 0x38800000u, 0x387FF000u, 0x7F7FFFFFu, 0xFF7FFFFFu};
  uint64_t x = 88172645463325252ull;
  while (v.size() < n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v.push_back(static_cast<uint32_t>(x));
  }
  return v;
}

void check_same(Backend& cpu, Backend& cuda, const std::vector<std::byte>& src, DType from, DType to, int64_t rows) {
  INFO(dtype_name(from) << " -> " << dtype_name(to) << ", " << rows << " rows of " << src.size() << " bytes");
  SlabResult a = cpu.assemble(slab_of(src, from, to, rows, true));
  auto expect = copy_of(a);
  FiniteCounts expect_counts = a.finite;
  SlabResult b = cuda.assemble(slab_of(src, from, to, rows, true));
  CHECK(copy_of(b) == expect);
  CHECK(b.finite.nan == expect_counts.nan);
  CHECK(b.finite.inf == expect_counts.inf);
}

}  // namespace

TEST_CASE("CUDA casts equal the CPU backend's bit for bit, NaN payloads included", "[cuda]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto cpu = make_cpu_backend(0);
  auto f32 = bytes_of(float32_patterns(1u << 20));
  check_same(*cpu, *cuda, f32, DType::kFloat32, DType::kBFloat16, 1024);
  check_same(*cpu, *cuda, f32, DType::kFloat32, DType::kFloat16, 1024);
  check_same(*cpu, *cuda, f32, DType::kFloat32, DType::kFloat64, 1024);  // no kernel: the host path
  std::vector<uint16_t> all16(65536);
  for (uint32_t i = 0; i < 65536; ++i) all16[i] = static_cast<uint16_t>(i);
  auto b16 = bytes_of(all16);
  check_same(*cpu, *cuda, b16, DType::kBFloat16, DType::kFloat32, 256);
  check_same(*cpu, *cuda, b16, DType::kFloat16, DType::kFloat32, 256);
  check_same(*cpu, *cuda, b16, DType::kBFloat16, DType::kFloat16, 256);
}

TEST_CASE("CUDA scans count NaN/Inf as the CPU scan for every floating dtype", "[cuda]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto cpu = make_cpu_backend(0);
  auto bytes = bytes_of(float32_patterns(1u << 18));  // 1 MiB of varied bits, read as every dtype
  for (DType d : {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kComplex32,
                  DType::kComplex64, DType::kComplex128, DType::kFloat8E4M3FN, DType::kFloat8E4M3FNUZ,
                  DType::kFloat8E5M2, DType::kFloat8E5M2FNUZ, DType::kFloat8E8M0FNU, DType::kInt32}) {
    INFO(dtype_name(d));
    std::size_t n = bytes.size() / dtype_size(d);
    FiniteCounts a = cpu->scan_finite(bytes.data(), d, n), b = cuda->scan_finite(bytes.data(), d, n);
    CHECK(a.nan == b.nan);
    CHECK(a.inf == b.inf);
  }
}

TEST_CASE("CUDA assembles slabs larger than a piece, and single rows larger than a piece", "[cuda]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto cpu = make_cpu_backend(0);
  // 160 MiB of float32: three pieces of 64 MiB, every lane of the ring used.
  auto big = bytes_of(float32_patterns(40u << 20));
  check_same(*cpu, *cuda, big, DType::kFloat32, DType::kBFloat16, 40 << 10);
  check_same(*cpu, *cuda, big, DType::kFloat32, DType::kFloat32, 40 << 10);  // gather + scan only
  check_same(*cpu, *cuda, big, DType::kFloat32, DType::kFloat16, 1);         // one 160 MiB row
}

TEST_CASE("CUDA cast of a host buffer equals the CPU backend's", "[cuda]") {
  auto cuda = cuda_or_skip();
  if (!cuda) return;
  auto cpu = make_cpu_backend(0);
  auto src = bytes_of(float32_patterns(4096));
  std::vector<std::byte> a(src.size() / 2), b(src.size() / 2);
  cpu->cast(src.data(), DType::kFloat32, a.data(), DType::kBFloat16, 4096);
  cuda->cast(src.data(), DType::kFloat32, b.data(), DType::kBFloat16, 4096);
  CHECK(a == b);
  CHECK_THAT(cuda->name(), Catch::StartsWith("cuda:0"));
}
