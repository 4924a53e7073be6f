#include <catch2/catch.hpp>

#include "core/checked.h"
#include "core/dtype.h"
#include "core/error.h"

using namespace ckpt;

TEST_CASE("error context is prepended outermost first", "[core]") {
  try {
    with_context("file a.distcp", [] {
      with_context("tensor model.w", [] { fail_data_loss("truncated"); });
    });
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "file a.distcp: tensor model.w: truncated");
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK(exit_code_for(e.code()) == 3);
  }
}

TEST_CASE("exit codes follow the README table", "[core]") {
  CHECK(exit_code_for(ErrorCode::kInvalidArgument) == 2);
  CHECK(exit_code_for(ErrorCode::kUnsafe) == 3);
  CHECK(exit_code_for(ErrorCode::kOutputFailed) == 4);
  CHECK(exit_code_for(ErrorCode::kInternal) == 5);
}

TEST_CASE("checked arithmetic rejects overflow", "[core]") {
  CHECK(checked_add(1, 2) == 3);
  CHECK_THROWS_AS(checked_add(UINT64_MAX, 1), Error);
  CHECK_THROWS_AS(checked_mul(1ull << 40, 1ull << 30), Error);
  CHECK(range_fits(8, 2, 10));
  CHECK_FALSE(range_fits(8, 3, 10));
  CHECK_FALSE(range_fits(11, 0, 10));
}

TEST_CASE("dtype names and storage classes map both ways", "[core]") {
  CHECK(dtype_from_name("bfloat16") == DType::kBFloat16);
  CHECK(dtype_from_name("half") == DType::kFloat16);
  CHECK(dtype_from_storage_class("LongStorage") == DType::kInt64);
  CHECK_FALSE(dtype_from_storage_class("UntypedStorage").has_value());
  CHECK(dtype_size(DType::kComplex128) == 16);
  CHECK(dtype_info(DType::kFloat8E5M2).is_floating);
}
