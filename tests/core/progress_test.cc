#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>

#include "core/progress.h"
#include "core/units.h"

using namespace ckpt;

TEST_CASE("byte counts use binary units with one decimal above bytes", "[core][progress]") {
  CHECK(human_bytes(0) == "0 B");
  CHECK(human_bytes(1023) == "1023 B");
  CHECK(human_bytes(1536) == "1.5 KiB");
  CHECK(human_bytes(12.0 * 1024 * 1024) == "12.0 MiB");
  CHECK(human_bytes(3.0 * 1024 * 1024 * 1024 * 1024 * 1024) == "3.0 PiB");
}

TEST_CASE("durations are m:ss below an hour and h:mm:ss above", "[core][progress]") {
  CHECK(format_duration(0) == "0:00");
  CHECK(format_duration(6.4) == "0:06");
  CHECK(format_duration(185) == "3:05");
  CHECK(format_duration(3723) == "1:02:03");
  CHECK(format_duration(-1) == "--");
  CHECK(format_duration(1.0 / 0.0) == "--");
}

TEST_CASE("the progress line gives bytes, percent, average throughput and the ETA it implies", "[core][progress]") {
  const double MiB = 1024.0 * 1024;
  // 12 MiB of 48 MiB in 2 s: 6 MiB/s, 36 MiB left -> 6 s.
  CHECK(format_progress_line("diff", uint64_t(12 * MiB), uint64_t(48 * MiB), 2.0) ==
        "diff  12.0 MiB / 48.0 MiB  25%  6.0 MiB/s  ETA 0:06");
  // All done: nothing left.
  CHECK(format_progress_line("consolidate", 2048, 2048, 1.0) ==
        "consolidate  2.0 KiB / 2.0 KiB  100%  2.0 KiB/s  ETA 0:00");
}

TEST_CASE("throughput and ETA wait for time to pass and bytes to be done", "[core][progress]") {
  CHECK(format_progress_line("diff", 0, 4096, 5.0) == "diff  0 B / 4.0 KiB  0%  --/s  ETA --");
  CHECK(format_progress_line("diff", 1024, 4096, 0.0) == "diff  1.0 KiB / 4.0 KiB  25%  --/s  ETA --");
  // Empty work counts as complete.
  CHECK(format_progress_line("diff", 0, 0, 0.0) == "diff  0 B / 0 B  100%  --/s  ETA --");
}

namespace {
// Runs fn with fd 2 redirected to a temporary file; returns what was written.
std::string capture_stderr(const std::function<void()>& fn) {
  std::fflush(stderr);
  FILE* tmp = std::tmpfile();
  int saved = dup(STDERR_FILENO);
  dup2(fileno(tmp), STDERR_FILENO);
  fn();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string out;
  std::rewind(tmp);
  for (int c; (c = std::fgetc(tmp)) != EOF;) out.push_back(static_cast<char>(c));
  std::fclose(tmp);
  return out;
}
}  // namespace

TEST_CASE("a scope draws its first and final counts, then erases its line", "[core][progress]") {
  set_progress_enabled(true);
  std::string written = capture_stderr([] {
    ProgressScope scope("copy", 100);
    progress_add(30);
    progress_add(20);
  });
  set_progress_enabled(false);
  CHECK(written.rfind("\rcopy  0 B / 100 B  0%", 0) == 0);
  CHECK(written.find("\rcopy  50 B / 100 B  50%") != std::string::npos);
  // Erased with spaces, no escape sequences.
  std::string last = "\rcopy  50 B / 100 B  50%  ";
  std::size_t erase_at = written.rfind('\r', written.size() - 2);
  REQUIRE(erase_at != std::string::npos);
  CHECK(written.back() == '\r');
  CHECK(written.find_first_not_of(' ', erase_at + 1) == written.size() - 1);
  CHECK(written.size() - erase_at - 2 >= last.size());
  CHECK(written.find('\x1b') == std::string::npos);
}

TEST_CASE("nothing is drawn while progress is disabled", "[core][progress]") {
  set_progress_enabled(false);
  std::string written = capture_stderr([] {
    progress_add(123);  // no scope open: counts nowhere
    ProgressScope scope("copy", 100);
    progress_add(50);
  });
  CHECK(written.empty());
}

TEST_CASE("a scope opened inside another draws nothing of its own", "[core][progress]") {
  set_progress_enabled(true);
  std::string written = capture_stderr([] {
    ProgressScope outer("outer", 10);
    ProgressScope inner("inner", 99);
    progress_add(10);
  });
  set_progress_enabled(false);
  CHECK(written.find("inner") == std::string::npos);
  CHECK(written.find("\router  10 B / 10 B  100%") != std::string::npos);
}
