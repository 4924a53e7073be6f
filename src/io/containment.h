// A checkpoint directory's files must be in it: a symlink (or a metadata
// path) that resolves outside reads a file the user did not give, so it is
// refused unless --follow-links (core/budgets.h) says the input is trusted.
#pragma once

#include <string>

namespace ckpt {

// Unsafe (exit 3) when `path` resolves (symlinks followed) outside `dir`,
// unless --follow-links. A path that does not exist is left to the open.
void require_inside(const std::string& path, const std::string& dir);

}  // namespace ckpt
