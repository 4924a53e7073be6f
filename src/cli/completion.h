// Shell completion scripts and the man page, generated from the CLI
// definition itself (every command, option, value list and help text), so
// they cannot drift from it. `ckptconv completion bash|zsh` prints a script;
// the build writes both and the man page (`ckptconv man`, hidden) into
// build/share and `cmake --install` installs them (docs/install.md).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace ckpt::cli {

std::string bash_completion(const CLI::App& app);
std::string zsh_completion(const CLI::App& app);
std::string man_page(const CLI::App& app);

// Adds `completion SHELL` and the hidden `man` to `app` (after every other
// command, which they describe).
void register_completion(CLI::App& app);

}  // namespace ckpt::cli
