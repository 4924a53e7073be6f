#include "io/isolate.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "core/error.h"

using namespace ckpt;

namespace {

constexpr uint64_t kMaxReply = 1 << 20;

// A server whose every request runs `work` and replies "done".
IsolatedServer server_of(std::function<void()> work, IsolationLimits limits = {10, 0, ""}) {
  return IsolatedServer("test work", std::move(limits), [work](const std::string&, std::string& reply) {
    work();
    reply = "done";
  });
}

std::optional<Error> error_of(IsolatedServer& server, const std::string& request = "go") {
  try {
    server.call(request, "a request", kMaxReply);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

std::optional<Error> error_of(std::function<void()> work, IsolationLimits limits = {10, 0, ""}) {
  IsolatedServer server("test work", std::move(limits), [work](const std::string&, std::string& reply) {
    work();
    reply = "done";
  });
  return error_of(server);
}

}  // namespace

TEST_CASE("isolate: a request is answered with the handler's reply") {
  IsolatedServer server("test work", {10, 0, ""},
                        [](const std::string& request, std::string& reply) { reply = "echo " + request; });
  CHECK(server.call("one", "a request", kMaxReply) == "echo one");
  CHECK(server.call(std::string(300000, 'x'), "a long request", kMaxReply).size() == 300005);
}

TEST_CASE("isolate: the handler's state lives in the child, across requests") {
  int count = 0;
  IsolatedServer server("test work", {10, 0, ""},
                        [count](const std::string&, std::string& reply) mutable { reply = std::to_string(++count); });
  CHECK(server.call("", "first", kMaxReply) == "1");
  CHECK(server.call("", "second", kMaxReply) == "2");
  CHECK(count == 0);  // this process's copy never ran
}

TEST_CASE("isolate: call_into reads a reply of exactly n bytes into the buffer") {
  IsolatedServer server("test work", {10, 0, ""},
                        [](const std::string& request, std::string& reply) { reply.assign(std::stoul(request), 'z'); });
  std::vector<char> buf(5 << 20, 0);  // larger than a socket buffer: read in pieces
  server.call_into(std::to_string(buf.size()), "bytes", buf.data(), buf.size());
  CHECK(std::count(buf.begin(), buf.end(), 'z') == static_cast<long>(buf.size()));
  CHECK_THROWS_AS(server.call_into("7", "bytes", buf.data(), 8), Error);  // 7 bytes sent for 8 asked
  CHECK_THROWS_AS(server.call("2000000", "a reply past its bound", kMaxReply), Error);
}

TEST_CASE("isolate: an error thrown in the child is rethrown with its code, and the child serves on") {
  IsolatedServer server("test work", {10, 0, ""}, [](const std::string& request, std::string& reply) {
    if (request == "bad") fail(ErrorCode::kUnimplemented, "not this layout");
    reply = "fine";
  });
  auto e = error_of(server, "bad");
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kUnimplemented);
  CHECK_THAT(e->what(), Catch::Contains("not this layout"));
  CHECK(server.call("good", "a request", kMaxReply) == "fine");
}

TEST_CASE("isolate: a crash in the child is DataLoss naming the signal, here and on every later call") {
  // Even where a handler is installed for it (a sanitizer's, a library's), the
  // child dies of the signal itself.
  auto previous = ::signal(SIGSEGV, [](int) { std::_Exit(0); });
  IsolatedServer server = server_of([] { ::raise(SIGSEGV); });
  auto e = error_of(server);
  ::signal(SIGSEGV, previous);
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kDataLoss);
  CHECK_THAT(e->what(),
             Catch::Contains("crashed the library") && Catch::Contains("signal 11") && Catch::Contains("a request"));
  auto again = error_of(server);
  REQUIRE(again);
  CHECK_THAT(again->what(), Catch::Contains("crashed the library"));
}

TEST_CASE("isolate: a child that exits before replying is DataLoss (the library ended it)") {
  auto e = error_of([] { ::_exit(1); });
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kDataLoss);
  CHECK_THAT(e->what(), Catch::Contains("exit status 1"));
}

TEST_CASE("isolate: a child past its time on one request is killed, DataLoss") {
  auto e = error_of([] { ::sleep(30); }, {0.3, 0, ""});
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kDataLoss);
  CHECK_THAT(e->what(), Catch::Contains("did not finish"));
}

TEST_CASE("isolate: the child has none of this process's files open") {
  int fd = ::open("/proc/self/stat", O_RDONLY);  // stands for an output being written
  REQUIRE(fd >= 3);
  IsolatedServer server("test work", {10, 0, ""}, [fd](const std::string&, std::string& reply) {
    reply = ::fcntl(fd, F_GETFD) < 0 && errno == EBADF ? "closed" : "open";
  });
  CHECK(server.call("", "the fd", kMaxReply) == "closed");
  CHECK(::fcntl(fd, F_GETFD) >= 0);  // still open here
  ::close(fd);
}

TEST_CASE("isolate: the child may read files, but not write, run a program or fork") {
  // What the child tries is harmless if it is allowed: a file of this test,
  // a signal 0.
  const std::string victim = "/tmp/ckpt-isolate-test-" + std::to_string(::getpid());
  ::close(::open(victim.c_str(), O_WRONLY | O_CREAT, 0644));
  IsolatedServer server("test work", {10, 0, ""}, [victim](const std::string& request, std::string& reply) {
    auto refused = [](long r) { return r < 0 && errno == EPERM; };
    if (request == "read") {
      int fd = ::open(CKPT_SOURCE_DIR "/README.md", O_RDONLY);
      char c = 0;
      reply = fd >= 0 && ::read(fd, &c, 1) == 1 ? "read" : "failed";
    } else if (request == "write") {
      reply = refused(::open((victim + ".new").c_str(), O_WRONLY | O_CREAT, 0644)) ? "refused" : "allowed";
    } else if (request == "unlink") {
      reply = refused(::unlink(victim.c_str())) ? "refused" : "allowed";
    } else if (request == "exec") {
      char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
      reply = refused(::execv("/bin/true", argv)) ? "refused" : "allowed";
    } else if (request == "fork") {
      pid_t pid = ::fork();
      if (pid == 0) ::_exit(0);
      reply = refused(pid) ? "refused" : "allowed";
    } else if (request == "kill") {
      reply = refused(::kill(::getppid(), 0)) ? "refused" : "allowed";
    }
  });
  CHECK(server.call("read", "a read", kMaxReply) == "read");
  for (const char* what : {"write", "unlink", "exec", "fork", "kill"}) {
    INFO(what);
    CHECK(server.call(what, what, kMaxReply) == "refused");
  }
  CHECK(::access((victim + ".new").c_str(), F_OK) != 0);
  CHECK(::access(victim.c_str(), F_OK) == 0);
  ::unlink(victim.c_str());
}

TEST_CASE("isolate: the child ends with the server") {
  pid_t child = 0;
  {
    IsolatedServer server("test work", {10, 0, ""},
                          [](const std::string&, std::string& reply) { reply = std::to_string(::getpid()); });
    child = static_cast<pid_t>(std::stol(server.call("", "its pid", kMaxReply)));
    CHECK(child != ::getpid());
    CHECK(::kill(child, 0) == 0);
  }
  errno = 0;
  CHECK(::kill(child, 0) != 0);  // reaped: no such process, not even a zombie
  CHECK(errno == ESRCH);
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
  auto e = error_of(big, {60, std::size_t{256} << 20, ""});
  REQUIRE(e);
  CHECK_THAT(e->what(), Catch::Contains("failed to allocate") && Catch::Contains("256"));
  CHECK(e->code() == ErrorCode::kDataLoss);
  CHECK_FALSE(error_of([] { std::vector<char> v(std::size_t{64} << 20, 1); }, {60, std::size_t{256} << 20, ""}));
}

TEST_CASE("isolate: running out of a named budget is Unsafe, naming how to raise it") {
  auto big = [] {
    std::vector<char> v(std::size_t{8} << 30);
    CHECK(v[12345] == 0);
  };
  auto e = error_of(big, {60, std::size_t{256} << 20, "hdf5-memory"});
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kUnsafe);
  CHECK_THAT(e->what(), Catch::Contains("hdf5-memory budget") && Catch::Contains("--limit hdf5-memory="));
}

TEST_CASE("isolate: a crash under a named budget says the budget may be too small") {
  auto e = error_of([] { ::raise(SIGSEGV); }, {60, std::size_t{256} << 20, "hdf5-memory"});
  REQUIRE(e);
  CHECK(e->code() == ErrorCode::kDataLoss);
  CHECK_THAT(e->what(), Catch::Contains("crashed the library") && Catch::Contains("or the hdf5-memory budget (256") &&
                            Catch::Contains("--limit hdf5-memory="));
  auto plain = error_of([] { ::raise(SIGSEGV); });
  REQUIRE(plain);
  CHECK_THAT(plain->what(), !Catch::Contains("budget"));
}
#endif
