#include "core/budgets.h"

#include <catch2/catch.hpp>

#include "core/error.h"

using namespace ckpt;

TEST_CASE("budgets: --limit NAME=VALUE sets the named budget, sizes or counts") {
  InputBudgets b;
  apply_limit(b, "pickle-memory=2G");
  apply_limit(b, "pickle-stack=4000000");
  apply_limit(b, "tree-values=100000000");
  apply_limit(b, "hdf5-memory=512M");
  CHECK(b.pickle_memory == uint64_t{2} << 30);
  CHECK(b.pickle_stack == 4000000);
  CHECK(b.tree_values == 100000000);
  CHECK(b.hdf5_memory == uint64_t{512} << 20);
}

TEST_CASE("budgets: an unknown name, a missing value or zero is a usage error naming the known ones") {
  InputBudgets b;
  for (const char* bad : {"hdf5-mem=1G", "hdf5-memory", "hdf5-memory=", "tree-values=0"}) {
    try {
      apply_limit(b, bad);
      FAIL("accepted " << bad);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kInvalidArgument);
    }
  }
  CHECK_THROWS_WITH(apply_limit(b, "x=1"), Catch::Contains("hdf5-memory") && Catch::Contains("pickle-memory"));
}

TEST_CASE("budgets: a value that is not a size is a usage error naming the option") {
  InputBudgets b;
  try {
    apply_limit(b, "hdf5-memory=abc");
    FAIL("accepted abc");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("--limit hdf5-memory") && Catch::Contains("'abc'"));
  }
}

TEST_CASE("budgets: the memory defaults scale with the input's size, and a set budget replaces them") {
  InputBudgets saved = input_budgets();
  set_input_budgets(InputBudgets{});
  CHECK(pickle_memory_budget(1000) == kPickleMemoryBase + 1000 * kPickleMemoryPerByte);
  CHECK(hdf5_memory_budget(50'000'000) == kHdf5MemoryBase + 50'000'000 * kHdf5MemoryPerByte);
  CHECK(hdf5_memory_budget(UINT64_MAX) > kHdf5MemoryBase);  // no overflow to a tiny cap
  InputBudgets b;
  b.hdf5_memory = 123;
  set_input_budgets(b);
  CHECK(hdf5_memory_budget(50'000'000) == 123);
  set_input_budgets(saved);
}
