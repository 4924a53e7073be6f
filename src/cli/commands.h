// Subcommand registry: each command lives in its own file with an options
// struct, a register_* that binds CLI11 options, and a run_* that does the work.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace ckpt::cli {

// Binds every subcommand to `app`.
void register_commands(CLI::App& app);
// Runs the subcommand the user chose; returns the process exit code.
int run_selected(CLI::App& app);

// Each command's registration adds its runner here.
void add_runner(CLI::App* sub, std::function<int()> run);

}  // namespace ckpt::cli
