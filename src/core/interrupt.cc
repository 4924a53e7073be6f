#include "core/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace ckpt {
namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_shrank_claimed{false};  // the first input to shrink is the one named
std::atomic<bool> g_shrank{false};          // set once its name is copied
char g_shrank_path[512];

extern "C" void on_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) ::_exit(128 + sig);  // the second one: stop now
}

}  // namespace

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // I/O loops go on to the next check instead of failing with EINTR
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

int interrupted_signal() { return g_signal.load(std::memory_order_relaxed); }

void check_interrupted() {
  if (int sig = interrupted_signal()) fail(ErrorCode::kInterrupted, std::string("interrupted by ") + signal_name(sig));
  if (g_shrank.load(std::memory_order_acquire))
    fail(ErrorCode::kDataLoss, std::string(g_shrank_path) +
                                   " was truncated while it was read (rewritten by a job still running?); "
                                   "nothing was written");
}

void note_input_shrank(const char* path) {
  bool expected = false;
  if (!g_shrank_claimed.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) return;
  std::size_t i = 0;
  for (; path[i] && i + 1 < sizeof g_shrank_path; ++i) g_shrank_path[i] = path[i];
  g_shrank_path[i] = '\0';
  g_shrank.store(true, std::memory_order_release);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

void stop_here_for_tests(const char* step) {
  const char* at = std::getenv("CKPTCONV_TEST_STOP_AT");
  if (at && std::strcmp(at, step) == 0) ::kill(::getpid(), SIGKILL);
}

}  // namespace ckpt
