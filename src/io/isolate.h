// Runs work that calls into a library we cannot make safe (libhdf5 trusts
// the structures it reads; a corrupt file can crash or hang it) in a forked
// child process. A crash or a hang there becomes a DataLoss error (exit 3)
// here, and a ckpt::Error the child threw is rethrown here unchanged, with
// its context and place. The child shares nothing back but that outcome:
// run the work again in this process once it is known to be safe.
#pragma once

#include <functional>
#include <string>

namespace ckpt {

// `what` names the work in messages ("reading model.h5 with libhdf5").
// `timeout_s` bounds the child's wall time (then SIGKILL, DataLoss).
void run_isolated(const std::string& what, double timeout_s, const std::function<void()>& work);

}  // namespace ckpt
