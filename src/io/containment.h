// A checkpoint directory's files must be in it: a symlink (or a metadata
// path) that resolves outside reads a file the user did not give, so it is
// refused unless --follow-links (core/budgets.h) says the input is trusted.
#pragma once

#include <string>

namespace ckpt {

// Unsafe (exit 3) when `path` resolves (symlinks followed) outside `dir`,
// unless --follow-links. A path that does not exist is left to the open.
void require_inside(const std::string& path, const std::string& dir);

// The one rule for every file a reader opens or a writer copies: a path
// named through a checkpoint folder (lexically under a registered root)
// must resolve inside that folder. Every open of a file source
// (io/byte_source.h) applies it, so no reader, side-file copy or export
// decides containment for itself. Paths the user named (SRC, --files,
// --manifest, --param-layout) are trusted as given, symlink or not.
void add_checkpoint_root(const std::string& dir);
void trust_given_path(const std::string& path);
// Unsafe when `path` is under a registered root and resolves outside it;
// unless --follow-links.
void require_contained(const std::string& path);

}  // namespace ckpt
