// A seccomp filter for a child process that only reads: what a library we
// cannot make safe (libhdf5 on a hostile file, io/isolate.h) could be made
// to do besides crashing is refused by the kernel with EPERM. Refused:
// running a program, making processes, network sockets, ptrace and writing
// another process's memory, signals to other processes, and every change to
// the file system (opening a file for writing, creating, removing, renaming,
// linking, truncating, changing modes or owners, mounting). Reading files,
// memory management, and writing to descriptors already open (the child's
// socket, stderr) stay allowed, so a library and a sanitizer run unchanged.
#pragma once

namespace ckpt {

// Installs the filter on the calling thread (and what it forks, which it
// cannot now do); no_new_privs is set first, as the kernel requires. Returns
// false where seccomp is unavailable (another architecture, an old kernel):
// the child then runs with the other confinements alone.
bool forbid_side_effects();

}  // namespace ckpt
