#include "io/mapped_inputs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/interrupt.h"
#include "io/byte_source.h"

using namespace ckpt;

namespace {

// A 1 MiB file of 'x', mapped as an input, truncated to 4 KiB, in a child:
// what a truncation notes is process-wide, and the other tests run on.
// `check` gets the mapping and returns the child's exit code (0: as expected).
int truncated_in_child(const std::string& tag, const std::function<int(const ByteSource&, const std::string&)>& check) {
  const std::string path = std::filesystem::temp_directory_path() / ("ckpt-" + tag + "-" + std::to_string(::getpid()));
  {
    std::ofstream f(path, std::ios::binary);
    std::vector<char> bytes(1 << 20, 'x');
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    SourcePtr src = open_mapped_source(path);
    if (src->data() == nullptr) ::_exit(20);
    std::filesystem::resize_file(path, 4096);
    ::_exit(check(*src, path));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::filesystem::remove(path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);  // 107: SIGBUS
}

// 0 when `work` throws DataLoss naming the file as truncated.
int data_loss_naming(const std::string& path, const std::function<void()>& work) {
  try {
    work();
  } catch (const Error& e) {
    return e.code() == ErrorCode::kDataLoss && std::strstr(e.what(), path.c_str()) &&
                   std::strstr(e.what(), "was truncated while it was read")
               ? 0
               : 11;
  }
  return 10;  // no error
}

}  // namespace

TEST_CASE("mapped inputs: a file truncated under its mapping reads as zeros, and the job stops with DataLoss") {
  CHECK(truncated_in_child("mapped", [](const ByteSource& src, const std::string& path) {
          char out[16];
          std::memcpy(out, src.data() + 65536, sizeof out);  // a lost page: SIGBUS without the handler
          if (out[0] != 0) return 1;
          std::memcpy(out, src.data() + 100, sizeof out);  // a kept page
          if (out[0] != 'x') return 2;
          return data_loss_naming(path, [] { check_interrupted(); });
        }) == 0);
}

TEST_CASE("mapped inputs: a write from a truncated input's lost pages is that input's DataLoss") {
  CHECK(truncated_in_child("mapped-w", [](const ByteSource& src, const std::string& path) {
          // The kernel fails the call (EFAULT) rather than raising SIGBUS.
          ssize_t put = ::write(::fileno(std::tmpfile()), src.data() + 65536, 16);
          if (put >= 0 || errno != EFAULT) return 1;
          return data_loss_naming(path, [&] { check_write_source(src.data() + 65536, EFAULT); });
        }) == 0);
}
