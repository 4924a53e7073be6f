#include "io/mapped_inputs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/interrupt.h"
#include "io/byte_source.h"

using namespace ckpt;

TEST_CASE("mapped inputs: a file truncated under its mapping reads as zeros, and the job stops with DataLoss") {
  const std::string path = std::filesystem::temp_directory_path() / ("ckpt-mapped-" + std::to_string(::getpid()));
  {
    std::ofstream f(path, std::ios::binary);
    std::vector<char> bytes(1 << 20, 'x');
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // In a child: what it notes is process-wide, and the other tests run on.
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 10;
    try {
      SourcePtr src = open_mapped_source(path);
      if (src->data() == nullptr) ::_exit(2);
      check_interrupted();  // nothing yet
      std::filesystem::resize_file(path, 4096);
      char out[16];
      std::memcpy(out, src->data() + 65536, sizeof out);  // a lost page: SIGBUS without the handler
      if (out[0] != 0) ::_exit(3);
      std::memcpy(out, src->data() + 100, sizeof out);  // a kept page
      if (out[0] != 'x') ::_exit(4);
      check_interrupted();
      code = 5;  // no error
    } catch (const Error& e) {
      code = e.code() == ErrorCode::kDataLoss && std::strstr(e.what(), path.c_str()) &&
                     std::strstr(e.what(), "was truncated while it was read")
                 ? 0
                 : 6;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  std::filesystem::remove(path);
  REQUIRE(WIFEXITED(status));  // not killed by SIGBUS
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("mapped inputs: a write from a truncated input's lost pages is that input's DataLoss") {
  const std::string path = std::filesystem::temp_directory_path() / ("ckpt-mapped-w-" + std::to_string(::getpid()));
  {
    std::ofstream f(path, std::ios::binary);
    std::vector<char> bytes(1 << 20, 'x');
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 10;
    try {
      SourcePtr src = open_mapped_source(path);
      std::filesystem::resize_file(path, 4096);
      FILE* out = std::tmpfile();
      // The kernel fails the call (EFAULT) rather than raising SIGBUS.
      ssize_t put = ::write(::fileno(out), src->data() + 65536, 16);
      if (put >= 0 || errno != EFAULT) ::_exit(2);
      check_write_source(src->data() + 65536, EFAULT);
      code = 3;  // no error
    } catch (const Error& e) {
      code = e.code() == ErrorCode::kDataLoss && std::strstr(e.what(), path.c_str()) ? 0 : 4;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  std::filesystem::remove(path);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
