// Runs work that calls into a library we cannot make safe (libhdf5 trusts
// the structures it reads; a corrupt file can crash or hang it) in a forked
// child process. A crash or a hang there becomes a DataLoss error (exit 3)
// here, and a ckpt::Error the child threw is rethrown here unchanged, with
// its context and place. The child shares nothing back but that outcome:
// run the work again in this process once it is known to be safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace ckpt {

struct IsolationLimits {
  double timeout_s;       // the child's wall time; then SIGKILL, DataLoss
  uint64_t memory_bytes;  // what the child may allocate beyond what it was forked with; 0: no cap
  // The budget (core/budgets.h) memory_bytes comes from: running out of it
  // is Unsafe (exit 3), naming it and how to raise it.
  std::string budget;
};

// `what` names the work in messages ("reading model.h5 with libhdf5"). In
// the child, crash signals have their default action (a crash inside the
// library ends it there, no handler of ours runs on a state the library
// corrupted), and an address-space cap makes a size a corrupt file inflates
// fail to allocate instead of taking the machine's memory: a 30 KB HDF5 mutant
// made libhdf5 malloc 7.5 GB for one attribute. The cap is not set under
// AddressSanitizer, whose shadow memory reserves terabytes of address space.
void run_isolated(const std::string& what, const IsolationLimits& limits, const std::function<void()>& work);

}  // namespace ckpt
