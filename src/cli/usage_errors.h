// Usage errors as a person needs them: "error: " first, naming what was
// typed in the order it was typed, then what to do instead: the closest
// subcommand or option for a typo ("did you mean consolidate?", "did you mean
// '--only model'?" for --only-model), and for many unexpected file arguments
// (a glob the shell expanded) "quote the glob or use --files".
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace ckpt::cli {

// The whole message for a parse error of `args` (argv without the program):
// an "error: ..." line and any hint lines, ending in a newline.
std::string usage_message(CLI::App& app, const std::vector<std::string>& args, const CLI::ParseError& error);

// The hint lines for a parse error of `args`, "" if none.
std::string usage_hint(CLI::App& app, const std::vector<std::string>& args);

// Edit distance, for suggestions.
std::size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace ckpt::cli
