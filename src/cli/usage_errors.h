// Usage errors as a person needs them: "error: " first, then what to do
// instead: the closest subcommand or option for a typo ("did you mean
// consolidate?"), and for many unexpected file arguments (a glob the shell
// expanded) "quote the glob or use --files".
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace ckpt::cli {

// The hint lines for a parse error of `args` (argv without the program), "" if none.
std::string usage_hint(CLI::App& app, const std::vector<std::string>& args);

// Edit distance, for suggestions.
std::size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace ckpt::cli
