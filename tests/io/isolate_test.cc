#include "io/isolate.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "core/error.h"

using namespace ckpt;

namespace {

// The code of the error run_isolated threw; nullopt when none.
std::optional<ErrorCode> code_of(const std::function<void()>& work, IsolationLimits limits = {10, 0, ""}) {
  try {
    run_isolated("test work", limits, work);
  } catch (const Error& e) {
    return e.code();
  }
  return std::nullopt;
}

std::string message_of(const std::function<void()>& work, IsolationLimits limits = {10, 0, ""}) {
  try {
    run_isolated("test work", limits, work);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("isolate: work that finishes is no error") {
  CHECK_FALSE(code_of([] {}).has_value());
}

TEST_CASE("isolate: an error thrown in the child is rethrown with its code and message") {
  std::string msg = message_of([] { fail(ErrorCode::kUnimplemented, "not this layout"); });
  CHECK(code_of([] { fail(ErrorCode::kUnimplemented, "not this layout"); }) == ErrorCode::kUnimplemented);
  CHECK_THAT(msg, Catch::Contains("not this layout"));
}

TEST_CASE("isolate: a crash in the child is DataLoss naming the signal, here nothing") {
  // Even where a handler is installed for it (a sanitizer's, a library's), the
  // child dies of the signal itself.
  auto previous = ::signal(SIGSEGV, [](int) { std::_Exit(0); });
  std::string msg = message_of([] { ::raise(SIGSEGV); });
  ::signal(SIGSEGV, previous);
  CHECK_THAT(msg, Catch::Contains("crashed the library") && Catch::Contains("signal 11"));
  CHECK(code_of([] { ::raise(SIGSEGV); }) == ErrorCode::kDataLoss);
}

TEST_CASE("isolate: a child that exits before writing its outcome is DataLoss (the library ended it)") {
  CHECK(code_of([] { ::_exit(1); }) == ErrorCode::kDataLoss);
  CHECK_THAT(message_of([] { ::_exit(1); }), Catch::Contains("exit status 1"));
}

TEST_CASE("isolate: a child past its time is killed, DataLoss") {
  std::string msg = message_of([] { ::sleep(30); }, {0.3, 0, ""});
  CHECK_THAT(msg, Catch::Contains("did not finish"));
}

#if !defined(__SANITIZE_ADDRESS__)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer)
#define CKPT_TEST_MEMORY_CAP 1
#endif
#else
#define CKPT_TEST_MEMORY_CAP 1
#endif
#endif

#ifdef CKPT_TEST_MEMORY_CAP
TEST_CASE("isolate: the child cannot allocate past its cap") {
  auto big = [] {
    std::vector<char> v(std::size_t{8} << 30);  // 8 GiB, zeroed: would take the pages
    CHECK(v[12345] == 0);
  };
  std::string msg = message_of(big, {60, std::size_t{256} << 20, ""});
  CHECK_THAT(msg, Catch::Contains("failed to allocate") && Catch::Contains("256"));
  CHECK(code_of(big, {60, std::size_t{256} << 20, ""}) == ErrorCode::kDataLoss);
  CHECK_FALSE(
      code_of([] { std::vector<char> v(std::size_t{64} << 20, 1); }, {60, std::size_t{256} << 20, ""}).has_value());
}

TEST_CASE("isolate: running out of a named budget is Unsafe, naming how to raise it") {
  auto big = [] {
    std::vector<char> v(std::size_t{8} << 30);
    CHECK(v[12345] == 0);
  };
  CHECK(code_of(big, {60, std::size_t{256} << 20, "hdf5-memory"}) == ErrorCode::kUnsafe);
  CHECK_THAT(message_of(big, {60, std::size_t{256} << 20, "hdf5-memory"}),
             Catch::Contains("hdf5-memory budget") && Catch::Contains("--limit hdf5-memory="));
}
#endif
