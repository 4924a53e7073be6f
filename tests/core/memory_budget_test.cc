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

TEST_CASE("an s3:// source's read-ahead is part of --memory-limit, not added to it", "[core][memory]") {
  const uint64_t limit = uint64_t{64} << 20;
  MemoryBudget local(limit), remote(limit, true);
  CHECK(local.read_ahead() == 0);
  CHECK(local.copy() == limit);
  CHECK(remote.read_ahead() == limit / 4);
  CHECK(remote.copy() + remote.read_ahead() == limit);
  CHECK(remote.diff() + remote.read_ahead() == limit);
  CHECK(remote.rescan() + remote.read_ahead() == limit);
  for (int workers : {1, 2, 7}) {
    CHECK(remote.read_ahead() + remote.scan_worker(workers, false) * static_cast<uint64_t>(workers) <= limit);
    CHECK(remote.read_ahead() + remote.file_streams() +
              remote.scan_worker(workers, true) * static_cast<uint64_t>(workers) <=
          limit);
  }
}
