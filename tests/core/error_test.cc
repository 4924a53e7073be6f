#include <catch2/catch.hpp>

#include "core/checked.h"
#include "core/dtype.h"
#include "core/error.h"

using namespace ckpt;

TEST_CASE("error context is prepended outermost first", "[core]") {
  try {
    with_context("file a.distcp", [] { with_context("tensor model.w", [] { fail_data_loss("truncated"); }); });
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
  CHECK(exit_code_for(ErrorCode::kInstallation) == 5);
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

TEST_CASE("each place is printed once, at its most precise", "[core]") {
  // What a DCP item read used to print: the .distcp range three times.
  Error e(ErrorCode::kDataLoss, "pickle opcode REDUCE at byte 47: bad");
  e.add_context("d/__5_0.distcp[8827:+2605][64:+1371]");
  e.add_context("data.pkl");
  e.add_context("d/__5_0.distcp[8827:+2605]");
  e.add_context("d/__5_0.distcp[8827:+2605]");
  e.add_context("key 'x'");
  CHECK(std::string(e.what()) ==
        "key 'x': data.pkl: d/__5_0.distcp[8827:+2605][64:+1371]: pickle opcode REDUCE at byte 47: bad");
  // a message that starts with its file drops the same file as context
  Error f(ErrorCode::kNotFound, "ckpt/x.pt: cannot open: No such file or directory");
  f.add_context("ckpt/x.pt");
  CHECK(std::string(f.what()) == "ckpt/x.pt: cannot open: No such file or directory");
  // a different place with a common prefix stays
  Error g(ErrorCode::kDataLoss, "bad");
  g.add_context("ckpt/x.pt2");
  g.add_context("ckpt/x.pt");
  CHECK(std::string(g.what()) == "ckpt/x.pt: ckpt/x.pt2: bad");
  CHECK(g.context().size() == 2);  // the chain itself is kept whole
}

TEST_CASE("an error's place is filled by the innermost layer that knows each part", "[core]") {
  try {
    with_place({"ckpt/__1_0.distcp", 1, ""}, [] {
      with_place({"", -1, "optim.state.w.exp_avg"}, [] {
        with_place({"ckpt/__1_0.distcp[64:+10]", -1, ""}, [] { fail_data_loss("truncated"); });
      });
    });
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.place().file == "ckpt/__1_0.distcp[64:+10]");
    CHECK(e.place().rank == 1);
    CHECK(e.place().tensor == "optim.state.w.exp_avg");
    CHECK(std::string(e.what()) == "truncated");  // a place adds no text
  }
}

TEST_CASE("messages are printable UTF-8 whatever the input held", "[core]") {
  CHECK(printable_text("plain text\tand\nlines") == "plain text\tand\nlines");
  CHECK(printable_text("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(printable_text(std::string("li\xf4tle", 6)) == "li\\xf4tle");
  CHECK(printable_text(std::string("a\0b\x1b[31m", 8)) == "a\\x00b\\x1b[31m");
  CHECK(printable_text("\xc0\xaf") == "\\xc0\\xaf");           // overlong
  CHECK(printable_text("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // a surrogate
  CHECK(printable_text("\xe2\x82") == "\\xe2\\x82");           // cut short
  Error e(ErrorCode::kDataLoss, std::string("name '\xff'"));
  CHECK(std::string(e.what()) == "name '\\xff'");
}
