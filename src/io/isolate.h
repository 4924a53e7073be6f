// Runs a library we cannot make safe (libhdf5 trusts the structures it reads:
// a corrupt file can crash it, hang it, or overflow a buffer without
// crashing) in a forked child process that serves requests for as long as
// an IsolatedServer lives. This process never runs that library on the
// input: it only sends requests and reads replies, so what it parses is the
// child's replies, never the file. A crash or a hang of the child becomes a
// DataLoss error (exit 3) here, and a ckpt::Error the child threw is
// rethrown here unchanged, with its context and place.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace ckpt {

struct IsolationLimits {
  double timeout_s;       // the child's wall time per request; then SIGKILL, DataLoss
  uint64_t memory_bytes;  // what the child may allocate beyond what it was forked with; 0: no cap
  // The budget (core/budgets.h) memory_bytes comes from: running out of it
  // is Unsafe (exit 3), naming it and how to raise it.
  std::string budget;
};

// `what` names the work in messages ("reading model.h5 with libhdf5"). The
// child is forked in the constructor, from a process with one thread (it
// runs the handler with whatever locks other threads held at the fork). In
// the child, only its socket stays open (the handler opens what it reads),
// and a seccomp filter (io/syscall_filter.h) refuses every side effect but
// writing to it; crash signals have their default action (a crash inside the
// library ends it there, no handler of ours runs on a state the library
// corrupted); Ctrl-C and SIGTERM are this process's to handle (the child
// ends when this process closes its socket, or dies); and an address-space
// cap makes a size a corrupt file inflates fail to allocate instead of
// taking the machine's memory: a 30 KB HDF5 mutant made libhdf5 malloc
// 7.5 GB for one attribute. The cap is not set under AddressSanitizer, whose
// shadow memory reserves terabytes of address space.
class IsolatedServer {
 public:
  // Runs in the child, once per request; what it leaves in `reply` is sent
  // back. State the handler keeps between requests lives in the child.
  using Handler = std::function<void(const std::string& request, std::string& reply)>;

  IsolatedServer(std::string what, IsolationLimits limits, Handler handler);
  ~IsolatedServer();  // ends the child
  IsolatedServer(const IsolatedServer&) = delete;
  IsolatedServer& operator=(const IsolatedServer&) = delete;

  // The child's reply to `request` (at most max_reply bytes). `doing` names
  // the request in messages. Once the child has failed, every call throws
  // that failure again. Calls from several threads take turns.
  std::string call(const std::string& request, const std::string& doing, uint64_t max_reply);
  // The same for a reply of exactly n bytes, read straight into `out`.
  void call_into(const std::string& request, const std::string& doing, void* out, std::size_t n);

 private:
  // Sends the request and reads the reply's header: its length once it is
  // the handler's reply; rethrows the child's error.
  uint64_t begin_call(const std::string& request, const std::string& doing, uint64_t max_reply);
  void read_reply(void* out, std::size_t n, const std::string& doing);
  [[noreturn]] void child_failed(const std::string& doing, bool timed_out);

  std::string what_;
  IsolationLimits limits_;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string failure_;  // set once the child failed (and was reaped): the message every later call repeats
  std::mutex mutex_;
  std::chrono::steady_clock::time_point deadline_;  // of the call in progress
};

}  // namespace ckpt
