// Temporary outputs ("<dest>.tmp-XXXXXX", a file or a directory) carry an
// flock held by the process writing them, for as long as it lives. A run
// killed by SIGKILL (which no process can catch) leaves its temporary output
// behind, unlocked: the next run writing the same destination removes it.
// A temporary output whose writer still runs is locked, and left alone.
#pragma once

#include <string>

namespace ckpt {

// "<dest>.tmp-": the path a temporary output's name starts with, six
// random characters following. When the destination's name is too long for
// that to fit in NAME_MAX (255 bytes), its name is cut and a hash of the
// whole name appended ("<cut>~<16 hex>.tmp-"), the same for every run.
std::string temp_prefix(const std::string& dest);

// Removes "<temp_prefix(dest)>??????" entries beside `dest` that no live process
// holds, saying so on the log.
void remove_stale_temps(const std::string& dest);

// Locks the just-created temporary `path` (open as `fd`) for this process.
// False when another run removed it in between (the caller makes a new one).
bool lock_new_temp(int fd, const std::string& path);

// Why a temporary output beside `dest` could not be made (errno `err`), as a
// person can act on it: the directory named, read-only filesystems and
// directories this user may not write said so.
std::string cannot_create_temp(const std::string& dest, int err);

}  // namespace ckpt
