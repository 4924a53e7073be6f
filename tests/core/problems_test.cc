#include <catch2/catch.hpp>

#include "core/problems.h"

using namespace ckpt;

TEST_CASE("without a sink a problem is thrown with its code and message; with one it is collected", "[check]") {
  Problem p{ErrorCode::kNotFound, "missing rank file x (rank 2)", "x", 2, ""};
  try {
    report_or_fail(nullptr, p);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kNotFound);
    CHECK(std::string(e.what()) == "missing rank file x (rank 2)");
  }
  ProblemSink sink;
  report_or_fail(&sink, p);
  REQUIRE(sink.problems().size() == 1);
  CHECK(sink.problems()[0].rank == 2);
}

TEST_CASE("run_reporting turns an escaping error into a problem only when a sink is given", "[check]") {
  auto boom = [] { fail_data_loss("bad bytes"); };
  CHECK_THROWS_AS(run_reporting(nullptr, "f", 1, "k", boom), Error);
  ProblemSink sink;
  CHECK_FALSE(run_reporting(&sink, "f", 1, "k", boom));
  CHECK(run_reporting(&sink, "f", 1, "k", [] {}));
  REQUIRE(sink.problems().size() == 1);
  const Problem& p = sink.problems()[0];
  CHECK(p.code == ErrorCode::kDataLoss);
  CHECK(p.message == "bad bytes");
  CHECK(p.file == "f");
  CHECK(p.tensor == "k");
}

TEST_CASE("a problem built from an error takes the error's place first, the reporter's for what it lacks", "[core]") {
  Error e(ErrorCode::kDataLoss, "bad");
  e.note_place({"d/__2_0.distcp", 2, ""});
  ProblemSink sink;
  sink.report(e, "d", -1, "model.w");
  REQUIRE(sink.problems().size() == 1);
  const Problem& p = sink.problems().front();
  CHECK(p.file == "d/__2_0.distcp");
  CHECK(p.rank == 2);
  CHECK(p.tensor == "model.w");
  CHECK(p.code == ErrorCode::kDataLoss);
}
