#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <utility>

#include "archive/zip_writer.h"
#include "backend_test_util.h"
#include "exec/backend.h"
#include "exec/finite_scan.h"

using namespace ckpt;
using namespace ckpt::testing;

namespace {

// 3M floats (12 MB): enough for the backend to split the work over threads.
std::vector<float> big_floats() {
  std::vector<float> v(3u << 20);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1000) * 0.5f - 7.f;
  v[17] = std::numeric_limits<float>::quiet_NaN();
  v[v.size() - 1] = -std::numeric_limits<float>::infinity();
  v[v.size() / 2] = std::numeric_limits<float>::infinity();
  return v;
}

}  // namespace

TEST_CASE("CPU assemble gathers every row once, over threads, in place", "[backend]") {
  auto src = bytes_of(big_floats());
  auto job = slab_of(src, DType::kFloat32, DType::kFloat32, 3072, false);
  std::mutex m;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  auto inner = job.gather;
  job.gather = [&](int64_t r0, int64_t r1, std::byte* dst) {
    {
      std::lock_guard<std::mutex> lock(m);
      ranges.emplace_back(r0, r1);
    }
    inner(r0, r1, dst);
  };
  auto backend = make_cpu_backend(4);
  SlabResult r = backend->assemble(job);
  CHECK(copy_of(r) == src);
  CHECK(ranges.size() > 1);  // 12 MB is split
  std::sort(ranges.begin(), ranges.end());
  int64_t next = 0;
  for (auto [a, b] : ranges) {
    CHECK(a == next);
    next = b;
  }
  CHECK(next == 3072);
}

TEST_CASE("CPU assemble counts NaN/Inf of the output like the reference scan, threaded or not", "[backend]") {
  auto src = bytes_of(big_floats());
  FiniteCounts reference = count_nonfinite(src.data(), DType::kFloat32, src.size() / 4);
  REQUIRE(reference.nan == 1);
  REQUIRE(reference.inf == 2);
  for (int threads : {1, 3}) {
    auto backend = make_cpu_backend(threads);
    SlabResult r = backend->assemble(slab_of(src, DType::kFloat32, DType::kFloat32, 3072, true));
    CHECK(r.finite.nan == reference.nan);
    CHECK(r.finite.inf == reference.inf);
    CHECK(backend->scan_finite(src.data(), DType::kFloat32, src.size() / 4).nan == 1);
  }
}

TEST_CASE("CPU assemble without a scan reports no counts, and keep_output=false returns no bytes", "[backend]") {
  auto src = bytes_of(big_floats());
  auto backend = make_cpu_backend(2);
  auto job = slab_of(src, DType::kFloat32, DType::kFloat32, 3072, false);
  CHECK(backend->assemble(job).finite.all_finite());
  job.scan = true;
  job.keep_output = false;
  SlabResult r = backend->assemble(job);
  CHECK(r.bytes.empty());
  CHECK(r.finite.nan == 1);
}

TEST_CASE("A gather failing on a worker thread fails assemble with its error", "[backend]") {
  auto src = bytes_of(big_floats());
  auto job = slab_of(src, DType::kFloat32, DType::kFloat32, 3072, false);
  job.gather = [](int64_t r0, int64_t r1, std::byte*) {
    if (r0 > 0) fail_data_loss("rows " + std::to_string(r0) + ".." + std::to_string(r1) + " unreadable");
  };
  auto backend = make_cpu_backend(4);
  try {
    backend->assemble(job);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK_THAT(e.what(), Catch::Contains("unreadable"));
  }
}

TEST_CASE("CPU assemble casts float32 to bfloat16 as torch rounds natively, the same split or whole", "[backend]") {
  // 1.0; halfway between 1.0 and the next bfloat16 (ties to even: down);
  // halfway above an odd one (up); the largest float (overflows to Inf).
  std::vector<uint32_t> bits = {0x3F800000u, 0x3F808000u, 0x3F818000u, 0x7F7FFFFFu};
  std::vector<uint16_t> want = {0x3F80u, 0x3F80u, 0x3F82u, 0x7F80u};
  auto src = bytes_of(bits);
  auto backend = make_cpu_backend(1);
  SlabResult r = backend->assemble(slab_of(src, DType::kFloat32, DType::kBFloat16, 4, true));
  CHECK(copy_of(r) == bytes_of(want));
  CHECK(r.finite.inf == 1);  // counted in the output: the overflow

  auto big = bytes_of(big_floats());
  auto split = copy_of(make_cpu_backend(4)->assemble(slab_of(big, DType::kFloat32, DType::kBFloat16, 3072, false)));
  std::vector<std::byte> whole(big.size() / 2);
  backend->cast(big.data(), DType::kFloat32, whole.data(), DType::kBFloat16, big.size() / 4);
  CHECK(split == whole);
}

TEST_CASE("CPU assemble sums the output's CRC-32 on its threads, equal to one pass over the bytes", "[backend]") {
  auto src = bytes_of(big_floats());
  for (int threads : {1, 3}) {
    for (DType to : {DType::kFloat32, DType::kBFloat16}) {
      auto backend = make_cpu_backend(threads);
      auto job = slab_of(src, DType::kFloat32, to, 3072, false);
      job.crc = true;
      SlabResult r = backend->assemble(job);
      REQUIRE(r.crc.has_value());
      CHECK(*r.crc == archive::crc32_update(0, r.bytes.data(), r.bytes.size()));
      job.crc = false;
      CHECK_FALSE(backend->assemble(job).crc.has_value());
    }
  }
}
