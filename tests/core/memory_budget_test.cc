#include <catch2/catch.hpp>

#include "core/memory_budget.h"

using namespace ckpt;

TEST_CASE("validate's consumers together stay within --memory-limit", "[core][memory]") {
  MemoryBudget budget(uint64_t{256} << 20);
  for (int workers : {1, 2, 7, 16}) {
    CHECK(budget.file_streams() + budget.scan_worker(workers, true) * static_cast<uint64_t>(workers) <= budget.total());
    CHECK(budget.scan_worker(workers, false) * static_cast<uint64_t>(workers) <= budget.total());
  }
  CHECK(budget.scan_worker(2, false) == uint64_t{128} << 20);
  CHECK(budget.scan_worker(2, true) == uint64_t{96} << 20);
}

TEST_CASE("a scan worker keeps its floor under a tiny limit", "[core][memory]") {
  MemoryBudget tiny(1000);
  CHECK(tiny.scan_worker(4, true) == MemoryBudget::kWorkerFloor);
  CHECK(tiny.copy() == 1000);
  CHECK(tiny.diff() == 1000);
  CHECK(MemoryBudget().total() == uint64_t{256} << 20);
}
