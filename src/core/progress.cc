#include "core/progress.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/interrupt.h"
#include "core/units.h"

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTick = std::chrono::milliseconds(250);
// Before this much time has passed an average rate means little.
constexpr double kMinSecondsForRate = 0.2;

// The one reporter. `mutex` guards everything but `done` and orders every
// write of the line against log messages.
struct Reporter {
  std::atomic<bool> enabled{false};
  std::atomic<bool> active{false};
  std::atomic<uint64_t> done{0};
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  bool drawn = false;
  std::size_t width = 0;  // characters of the line drawn last
  std::string label;
  uint64_t total = 0;
  Clock::time_point start;
  std::thread ticker;
};

Reporter& reporter() {
  static Reporter r;
  return r;
}

// "\r<line>", padded with spaces over what a longer earlier line left:
// plain characters only, so no terminal escape ever reaches stderr (NO_COLOR
// needs nothing special). Caller holds the mutex.
void draw_locked(Reporter& r) {
  double elapsed = std::chrono::duration<double>(Clock::now() - r.start).count();
  uint64_t done = std::min(r.done.load(std::memory_order_relaxed), r.total);
  std::string line = format_progress_line(r.label, done, r.total, elapsed);
  std::size_t width = line.size();
  if (line.size() < r.width) line.append(r.width - line.size(), ' ');
  std::fputc('\r', stderr);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  r.width = width;
  r.drawn = true;
}

void erase_locked(Reporter& r) {
  if (!r.drawn) return;
  std::string blank(r.width + 2, ' ');
  blank.front() = blank.back() = '\r';
  std::fputs(blank.c_str(), stderr);
  std::fflush(stderr);
  r.drawn = false;
  r.width = 0;
}

void tick_loop(Reporter& r) {
  std::unique_lock lock(r.mutex);
  while (!r.wake.wait_for(lock, kTick, [&] { return r.stop; })) draw_locked(r);
}

}  // namespace

void configure_progress(bool quiet) {
  const char* term = std::getenv("TERM");
  bool dumb = term && std::strcmp(term, "dumb") == 0;
  set_progress_enabled(!quiet && !dumb && isatty(STDERR_FILENO) == 1);
}

void set_progress_enabled(bool enabled) { reporter().enabled = enabled; }
bool progress_enabled() { return reporter().enabled; }

void progress_add(uint64_t bytes) {
  check_interrupted();  // every byte a job moves passes here: the place to stop
  Reporter& r = reporter();
  if (r.active.load(std::memory_order_relaxed)) r.done.fetch_add(bytes, std::memory_order_relaxed);
}

ProgressScope::ProgressScope(std::string label, uint64_t total_bytes) {
  Reporter& r = reporter();
  if (!r.enabled) return;
  std::lock_guard lock(r.mutex);
  if (r.active) return;
  owner_ = true;
  r.label = std::move(label);
  r.total = total_bytes;
  r.done = 0;
  r.start = Clock::now();
  r.stop = false;
  r.active = true;
  draw_locked(r);
  r.ticker = std::thread(tick_loop, std::ref(r));
}

ProgressScope::~ProgressScope() {
  if (!owner_) return;
  Reporter& r = reporter();
  {
    std::lock_guard lock(r.mutex);
    r.stop = true;
  }
  r.wake.notify_all();
  r.ticker.join();
  std::lock_guard lock(r.mutex);
  draw_locked(r);  // the final count, then a clean line for what follows
  erase_locked(r);
  r.active = false;
}

void with_progress_line_erased(const std::function<void()>& write) {
  Reporter& r = reporter();
  if (!r.active.load()) {
    write();
    return;
  }
  std::lock_guard lock(r.mutex);
  erase_locked(r);
  write();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  auto s = static_cast<uint64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%llu:%02llu:%02llu", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s / 60 % 60), static_cast<unsigned long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llu:%02llu", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  return buf;
}

std::string format_progress_line(const std::string& label, uint64_t done, uint64_t total, double elapsed_s) {
  std::string line =
      label + "  " + human_bytes(static_cast<double>(done)) + " / " + human_bytes(static_cast<double>(total));
  int percent = total == 0 ? 100 : static_cast<int>(static_cast<double>(done) * 100.0 / static_cast<double>(total));
  line += "  " + std::to_string(percent) + "%";
  bool have_rate = elapsed_s >= kMinSecondsForRate && done > 0;
  double rate = have_rate ? static_cast<double>(done) / elapsed_s : 0;
  line += "  " + (have_rate ? human_bytes(rate) + "/s" : std::string("--/s"));
  double eta = have_rate ? static_cast<double>(total > done ? total - done : 0) / rate : -1;
  line += "  ETA " + format_duration(eta);
  return line;
}

}  // namespace ckpt
