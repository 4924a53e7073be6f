#include "io/isolate.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "core/budgets.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/units.h"
#include "io/syscall_filter.h"

namespace ckpt {
namespace {

// Requests travel as an 8-byte length and the bytes; replies as a kind byte
// ('O' the handler's reply, 'E' an error), an 8-byte length and the bytes.
// An error's bytes are its code number and the strings of ckpt::Error, each
// as "<length>:<bytes>".
void put(std::string& out, const std::string& s) { out += std::to_string(s.size()) + ":" + s; }

bool take(const std::string& in, std::size_t& pos, std::string& s) {
  std::size_t colon = in.find(':', pos);
  if (colon == std::string::npos || colon == pos || colon - pos > 9) return false;
  for (std::size_t i = pos; i < colon; ++i)
    if (in[i] < '0' || in[i] > '9') return false;
  std::size_t n = std::stoul(in.substr(pos, colon - pos));
  if (n > in.size() - colon - 1) return false;
  s = in.substr(colon + 1, n);
  pos = colon + 1 + n;
  return true;
}

// A small decimal number, or nullopt.
std::optional<int> small_int(const std::string& s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  std::size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return std::nullopt;
  for (std::size_t k = i; k < s.size(); ++k)
    if (s[k] < '0' || s[k] > '9') return std::nullopt;
  return std::stoi(s);
}

std::string encode(const Error& e) {
  std::string out;
  put(out, std::to_string(static_cast<int>(e.code())));
  put(out, e.message());
  put(out, e.place().file);
  put(out, std::to_string(e.place().rank));
  put(out, e.place().tensor);
  put(out, std::to_string(e.context().size()));
  for (const auto& c : e.context()) put(out, c);
  return out;
}

// The child's error, thrown here. Its bytes are the child's: checked as
// input, never trusted (a child may claim any code but Installation or
// Interrupted, which are this process's to say).
[[noreturn]] void rethrow(const std::string& in, const std::string& what) {
  auto unreadable = [&] { fail_data_loss(what + ": the reader process sent an unreadable error"); };
  std::size_t pos = 0;
  std::string code, message, file, rank, tensor, n;
  if (!take(in, pos, code) || !take(in, pos, message) || !take(in, pos, file) || !take(in, pos, rank) ||
      !take(in, pos, tensor) || !take(in, pos, n))
    unreadable();
  auto code_number = small_int(code), rank_number = small_int(rank), count = small_int(n);
  if (!code_number || !rank_number || !count || *count < 0 || *code_number < 0 ||
      *code_number > static_cast<int>(ErrorCode::kInternal))
    unreadable();
  Error e(static_cast<ErrorCode>(*code_number), message);
  std::vector<std::string> context;
  for (int i = 0; i < *count; ++i) {
    if (!take(in, pos, context.emplace_back())) unreadable();
  }
  for (auto it = context.rbegin(); it != context.rend(); ++it) e.add_context(*it);  // innermost first
  e.note_place({file, *rank_number, tensor});
  throw e;
}

// MSG_NOSIGNAL: a peer that is gone is a false return, not a SIGPIPE.
bool send_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

std::string frame(char kind, const std::string& payload) {
  std::string out(1, kind);
  uint64_t n = payload.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  return out + payload;
}

// Blocking: the child waits for the next request as long as it takes.
bool read_exact(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
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

// In the child, before any request (see isolate.h).
void confine_child(int fd, uint64_t memory_bytes, pid_t parent) {
  // Only the socket stays open: the library opens what it reads itself, and
  // must not reach what this process had open (an output being written,
  // another reader child's socket, which would keep that child from seeing
  // its parent close it).
  ::close_range(3, static_cast<unsigned>(fd) - 1, 0);
  ::close_range(static_cast<unsigned>(fd) + 1, ~0U, 0);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::signal(sig, SIG_DFL);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_IGN);
  // A parent killed outright (SIGKILL, the OOM killer) takes the child with
  // it, even one looping inside the library; otherwise the child ends when
  // the parent's socket closes. The death signal follows the forking
  // thread, the only one (see isolate.h).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(0);  // the parent died before prctl
  if (memory_bytes != 0 && !kAddressSanitizer) {
    if (uint64_t now = address_space_bytes()) {
      rlimit cap{now + memory_bytes, now + memory_bytes};
      ::setrlimit(RLIMIT_AS, &cap);
    }
  }
  forbid_side_effects();  // last: it also forbids what the lines above do
}

// The child's socket and its prepared out-of-memory reply, for
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
  send_all(g_child_fd, g_out_of_memory->data(), g_out_of_memory->size());
  ::_exit(0);
}

// The child's reply to one request: its kind ('O' or 'E') and bytes.
char serve_one(const IsolatedServer::Handler& handler, const std::string& request, std::string& reply) {
  try {
    handler(request, reply);
    return 'O';
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const Error& e) {
    reply = encode(e);
  } catch (const std::exception& e) {
    reply = encode(Error(ErrorCode::kInternal, e.what()));
  } catch (...) {
    reply = encode(Error(ErrorCode::kInternal, "unknown exception"));
  }
  return 'E';
}

// The header and the bytes as two sends: a reply of tensor bytes is not
// copied again to join them.
bool send_reply(int fd, char kind, const std::string& payload) {
  char header[1 + sizeof(uint64_t)] = {kind};
  uint64_t n = payload.size();
  std::memcpy(header + 1, &n, sizeof n);
  return send_all(fd, header, sizeof header) && send_all(fd, payload.data(), payload.size());
}

// The child: serves requests until the parent closes its socket. What
// running out of memory says is made before any work: at the cap, nothing
// is left to build it with (building it in the handler threw bad_alloc
// again, and the child died of terminate()).
[[noreturn]] void serve(int fd, const std::string& what, const IsolationLimits& limits,
                        const IsolatedServer::Handler& handler) {
  std::string beyond;
  if (limits.memory_bytes) {
    beyond = " (more than " + human_bytes(static_cast<double>(limits.memory_bytes));
    if (!limits.budget.empty()) beyond += ", the " + limits.budget + " budget; " + budget_hint(limits.budget);
    beyond += ")";
  }
  const std::string out_of_memory_error =
      encode(Error(limits.budget.empty() ? ErrorCode::kDataLoss : ErrorCode::kUnsafe,
                   what + " failed to allocate what the file asks for" + beyond + ": a size in it is corrupt" +
                       (limits.budget.empty() ? "" : ", or the file holds more than the budget allows")));
  const std::string out_of_memory = frame('E', out_of_memory_error);
  g_child_fd = fd;
  g_out_of_memory = &out_of_memory;
  std::set_terminate(child_terminate);
  // Kept between requests: a fresh buffer for each 4 MB slab of tensor
  // bytes cost page faults that tripled the time of a read.
  std::string request, reply;
  while (true) {
    uint64_t n = 0;
    if (!read_exact(fd, &n, sizeof n)) ::_exit(0);  // the parent is done
    try {
      request.assign(static_cast<std::size_t>(n), '\0');
      if (!read_exact(fd, request.data(), request.size())) ::_exit(0);
      reply.clear();
      char kind = serve_one(handler, request, reply);
      if (!send_reply(fd, kind, reply)) ::_exit(0);
    } catch (const std::bad_alloc&) {  // in the work, or in describing how it failed
      if (!send_all(fd, out_of_memory.data(), out_of_memory.size())) ::_exit(0);
    }
  }
}

void reap(pid_t pid, int* status) {
  while (::waitpid(pid, status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

IsolatedServer::IsolatedServer(std::string what, IsolationLimits limits, Handler handler)
    : what_(std::move(what)), limits_(std::move(limits)) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    fail(ErrorCode::kResourceExhausted, what_ + ": socketpair: " + std::strerror(errno));
  pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    fail(ErrorCode::kResourceExhausted, what_ + ": fork: " + std::strerror(errno));
  }
  if (pid_ == 0) {
    // The child: only requests, then _exit (no atexit handlers, no stdio
    // flush of buffers the parent owns).
    ::close(fds[0]);
    int buffer = 4 << 20;
    ::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    confine_child(fds[1], limits_.memory_bytes, parent);
    serve(fds[1], what_, limits_, handler);
  }
  ::close(fds[1]);
  fd_ = fds[0];
  // Tensor bytes come back a slab (4 MB) at a time: a socket buffer of the
  // default size (about 200 KB) would make each slab dozens of wakeups.
  int buffer = 4 << 20;
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
}

IsolatedServer::~IsolatedServer() {
  ::close(fd_);
  if (failure_.empty()) {  // a failed child was reaped when it failed
    // The child has nothing to flush: end it now rather than wait for it to
    // notice the closed socket.
    ::kill(pid_, SIGKILL);
    reap(pid_, nullptr);
  }
}

std::string IsolatedServer::call(const std::string& request, const std::string& doing, uint64_t max_reply) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t n = begin_call(request, doing, max_reply);
  // Grown as the bytes arrive: a length the child claims costs this process
  // only the bytes it really sends.
  constexpr uint64_t kPiece = 1 << 20;
  std::string reply;
  while (reply.size() < n) {
    std::size_t at = reply.size();
    reply.resize(at + static_cast<std::size_t>(std::min(kPiece, n - at)));
    read_reply(reply.data() + at, reply.size() - at, doing);
  }
  return reply;
}

void IsolatedServer::call_into(const std::string& request, const std::string& doing, void* out, std::size_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t got = begin_call(request, doing, n);
  if (got != n)
    fail_data_loss(what_ + " (" + doing + "): the reader process sent " + std::to_string(got) + " bytes for " +
                   std::to_string(n));
  read_reply(out, n, doing);
}

uint64_t IsolatedServer::begin_call(const std::string& request, const std::string& doing, uint64_t max_reply) {
  if (!failure_.empty()) fail_data_loss(failure_);
  deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                     std::chrono::duration<double>(limits_.timeout_s));
  uint64_t n = request.size();
  if (!send_all(fd_, &n, sizeof n) || !send_all(fd_, request.data(), request.size())) child_failed(doing, false);
  char header[1 + sizeof(uint64_t)];
  read_reply(header, sizeof header, doing);
  uint64_t length = 0;
  std::memcpy(&length, header + 1, sizeof length);
  if (header[0] == 'E') {
    // An error is a few names and a message; more is not one our code sent.
    constexpr uint64_t kMaxError = uint64_t{1} << 20;
    if (length > kMaxError) fail_data_loss(what_ + " (" + doing + "): the reader process sent an oversized error");
    std::string in(static_cast<std::size_t>(length), '\0');
    read_reply(in.data(), in.size(), doing);
    rethrow(in, what_);
  }
  if (header[0] != 'O' || length > max_reply)
    fail_data_loss(what_ + " (" + doing + "): the reader process sent an unreadable reply");
  return length;
}

// Reads n bytes of the reply before the call's deadline; a child that ends
// or passes it has failed. Ctrl-C ends the call (the child ignores it).
void IsolatedServer::read_reply(void* out, std::size_t n, const std::string& doing) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    if (interrupted_signal()) {
      ::kill(pid_, SIGKILL);
      reap(pid_, nullptr);
      failure_ = what_ + " was interrupted";
      check_interrupted();
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
    if (left.count() <= 0) child_failed(doing, true);
    pollfd pfd{fd_, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 200)));
    if (r <= 0) continue;  // EINTR, or a slice of the wait without data
    ssize_t got = ::read(fd_, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) child_failed(doing, false);  // EOF: the child ended (or died) mid-call
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

// The child ended before replying, or passed the deadline: reaped, and what
// happened to it is this call's error and every later call's.
void IsolatedServer::child_failed(const std::string& doing, bool timed_out) {
  if (timed_out) ::kill(pid_, SIGKILL);
  int status = 0;
  reap(pid_, &status);
  std::string where = what_ + " (" + doing + ")";
  if (timed_out) {
    failure_ = where + " did not finish within " + std::to_string(static_cast<long long>(limits_.timeout_s)) +
               " s (a corrupt file can make the library loop); the file is refused";
  } else if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    // Under a cap too small for the library's own needs, it crashes on a
    // sound file (--limit hdf5-memory=1K: a SIGSEGV in libhdf5).
    std::string or_budget;
    if (limits_.memory_bytes != 0 && !limits_.budget.empty() && !kAddressSanitizer)
      or_budget = ", or the " + limits_.budget + " budget (" + human_bytes(static_cast<double>(limits_.memory_bytes)) +
                  ") is too small for it (" + budget_hint(limits_.budget) + ")";
    failure_ = where + " crashed the library (signal " + std::to_string(sig) + ", " + ::sigdescr_np(sig) +
               "): the file is corrupt" + or_budget + "; nothing was written";
  } else {
    // Ended before our code replied: the library ended the process (exit(),
    // or a sanitizer's report of its heap overflow on a mutant, found by
    // hdf5_reader_fuzz). A refusal of the file, like a crash.
    failure_ = where + " ended the process (exit status " +
               std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
               ") before it finished: the file is corrupt; nothing was written";
  }
  fail_data_loss(failure_);
}

}  // namespace ckpt
