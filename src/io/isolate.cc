#include "io/isolate.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "core/budgets.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/units.h"

namespace ckpt {
namespace {

// The child's outcome on the pipe: a code byte ('0' ok, else 'E'), then for
// an error the code number and the strings of ckpt::Error, each as
// "<length>:<bytes>".
void put(std::string& out, const std::string& s) { out += std::to_string(s.size()) + ":" + s; }

bool take(const std::string& in, std::size_t& pos, std::string& s) {
  std::size_t colon = in.find(':', pos);
  if (colon == std::string::npos) return false;
  std::size_t n = std::stoul(in.substr(pos, colon - pos));
  if (colon + 1 + n > in.size()) return false;
  s = in.substr(colon + 1, n);
  pos = colon + 1 + n;
  return true;
}

std::string encode(const Error& e) {
  std::string out = "E";
  put(out, std::to_string(static_cast<int>(e.code())));
  put(out, e.message());
  put(out, e.place().file);
  put(out, std::to_string(e.place().rank));
  put(out, e.place().tensor);
  put(out, std::to_string(e.context().size()));
  for (const auto& c : e.context()) put(out, c);
  return out;
}

[[noreturn]] void rethrow(const std::string& in, const std::string& what) {
  std::size_t pos = 1;
  std::string code, message, file, rank, tensor, n;
  if (!take(in, pos, code) || !take(in, pos, message) || !take(in, pos, file) || !take(in, pos, rank) ||
      !take(in, pos, tensor) || !take(in, pos, n)) {
    fail(ErrorCode::kInternal, what + ": the isolated reader sent an unreadable outcome");
  }
  Error e(static_cast<ErrorCode>(std::stoi(code)), message);
  std::vector<std::string> context(std::stoul(n));
  for (auto& c : context) {
    if (!take(in, pos, c)) fail(ErrorCode::kInternal, what + ": the isolated reader sent an unreadable outcome");
  }
  for (auto it = context.rbegin(); it != context.rend(); ++it) e.add_context(*it);  // innermost first
  e.note_place({file, std::stoi(rank), tensor});
  throw e;
}

void write_all(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    done += static_cast<std::size_t>(w);
  }
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// The child's address space now (/proc/self/statm counts pages); 0 when unknown.
uint64_t address_space_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long pages = 0;
  int got = std::fscanf(f, "%llu", &pages);
  std::fclose(f);
  return got == 1 ? pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

// In the child, before the work (see isolate.h).
void confine_child(uint64_t memory_bytes) {
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::signal(sig, SIG_DFL);
  if (memory_bytes == 0 || kAddressSanitizer) return;
  if (uint64_t now = address_space_bytes()) {
    rlimit cap{now + memory_bytes, now + memory_bytes};
    ::setrlimit(RLIMIT_AS, &cap);
  }
}

// The child's pipe and its prepared out-of-memory outcome, for
// child_terminate (the child is single-threaded: it is forked from one).
int g_child_fd = -1;
const std::string* g_out_of_memory = nullptr;

// Where a bad_alloc cannot be caught (thrown by a destructor during the
// unwinding: nlohmann::json frees a large array through a stack it
// allocates, and at the cap that fails too), std::terminate still reports
// it as running out of memory, not as a crash of the library.
[[noreturn]] void child_terminate() {
  bool out_of_memory = false;
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      out_of_memory = true;
    } catch (...) {
    }
  }
  if (!out_of_memory || g_child_fd < 0 || !g_out_of_memory) std::abort();
  write_all(g_child_fd, *g_out_of_memory);
  ::_exit(0);
}

// Runs `work` in the child and writes its outcome to `fd`. What running out
// of memory says is made before the work: at the cap, nothing is left to
// build it with (building it in the handler threw bad_alloc again, and the
// child died of terminate()).
void run_child(int fd, const std::string& what, const IsolationLimits& limits, const std::function<void()>& work) {
  std::string beyond;
  if (limits.memory_bytes) {
    beyond = " (more than " + human_bytes(static_cast<double>(limits.memory_bytes));
    if (!limits.budget.empty()) beyond += ", the " + limits.budget + " budget; " + budget_hint(limits.budget);
    beyond += ")";
  }
  const std::string out_of_memory =
      encode(Error(limits.budget.empty() ? ErrorCode::kDataLoss : ErrorCode::kUnsafe,
                   what + " failed to allocate what the file asks for" + beyond + ": a size in it is corrupt" +
                       (limits.budget.empty() ? "" : ", or the file holds more than the budget allows")));
  g_child_fd = fd;
  g_out_of_memory = &out_of_memory;
  std::set_terminate(child_terminate);
  try {
    std::string outcome;
    try {
      work();
      outcome = "0";
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const Error& e) {
      outcome = encode(e);
    } catch (const std::exception& e) {
      outcome = encode(Error(ErrorCode::kInternal, e.what()));
    } catch (...) {
      outcome = encode(Error(ErrorCode::kInternal, "unknown exception"));
    }
    write_all(fd, outcome);
  } catch (const std::bad_alloc&) {  // in the work, or in describing how it failed
    write_all(fd, out_of_memory);
  }
}

}  // namespace

void run_isolated(const std::string& what, const IsolationLimits& limits, const std::function<void()>& work) {
  const double timeout_s = limits.timeout_s;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail(ErrorCode::kInternal, what + ": pipe: " + std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    fail(ErrorCode::kResourceExhausted, what + ": fork: " + std::strerror(errno));
  }
  if (pid == 0) {
    // The child: only the work, then _exit (no atexit handlers, no stdio
    // flush of buffers the parent owns).
    ::close(fds[0]);
    confine_child(limits.memory_bytes);
    run_child(fds[1], what, limits, work);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string outcome;
  bool timed_out = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: the child exited (or closed the pipe by dying)
    outcome.append(buf, static_cast<std::size_t>(got));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  check_interrupted();  // Ctrl-C reaches the child too: that is no crash of the library
  if (timed_out) {
    fail_data_loss(what + " did not finish within " + std::to_string(static_cast<long long>(timeout_s)) +
                   " s (a corrupt file can make the library loop); the file is refused");
  }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    fail_data_loss(what + " crashed the library (signal " + std::to_string(sig) + ", " + ::sigdescr_np(sig) +
                   "): the file is corrupt; nothing was written");
  }
  if (outcome == "0") return;
  if (!outcome.empty() && outcome[0] == 'E') rethrow(outcome, what);
  std::string exit_status = std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  // Ended before our code could write anything: the library ended the
  // process (exit(), or a sanitizer's report of its heap overflow on a
  // mutant, found by hdf5_reader_fuzz). A refusal of the file, like a crash.
  if (outcome.empty())
    fail_data_loss(what + " ended the process (exit status " + exit_status +
                   ") before it finished: the file is corrupt; nothing was written");
  fail(ErrorCode::kInternal,
       what + ": the isolated reader exited with status " + exit_status + " and an unreadable outcome");
}

}  // namespace ckpt
