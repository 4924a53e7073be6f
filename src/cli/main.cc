// ckptconv entry point: global flags, subcommand registration, and the one
// place where errors become exit codes (README "Exit codes").
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <iostream>
#include <new>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/completion.h"
#include "cli/usage_errors.h"
#include "core/budgets.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/logging.h"
#include "core/progress.h"
#include "jobs/source_kinds.h"
#include "jobs/version.h"

int main(int argc, char** argv) {
  CLI::App app{"ckptconv: inspect, validate, diff, consolidate and reshard sharded PyTorch checkpoints (" +
                   ckpt::jobs::source_kind_names() + ")",
               "ckptconv"};
  app.require_subcommand(0, 1);
  // -q/-v also after the subcommand (`ckptconv diff A B -q` in a CI script).
  app.fallthrough();
  app.footer(
      "Exit codes: 0 success (valid, equal); 1 validate found problems or diff found differences; 2 usage error;\n"
      "3 input unreadable, corrupt, unsupported or unsafe; 4 output could not be written or a resource limit was hit;\n"
      "5 installation problem (a plugin or LibTorch missing) or internal error. Results go to stdout; logs, errors\n"
      "and progress (only on a terminal) to stderr.");
  bool quiet = false, verbose = false;
  app.add_flag("-q,--quiet", quiet, "Only print errors on stderr");
  app.add_flag("-v,--verbose", verbose, "Print debug messages on stderr");
  app.set_version_flag("--version", ckpt::jobs::version_text);
  std::vector<std::string> limits;
  app.add_option("--limit", limits,
                 "Raise a budget on what an input may make the tool spend, for trusted input: NAME=VALUE with "
                 "NAME pickle-memory (default 64M + 128 x the pickle's size), pickle-stack (1048576 values), "
                 "tree-values (16777216) or hdf5-memory (1G + 16 x the file's size); repeatable (docs/limits.md)")
      ->type_name("NAME=VALUE")
      ->take_all();
  bool follow_links = false;
  app.add_flag("--follow-links", follow_links,
               "Read symlinks that leave the checkpoint's directory and HDF5 external links (refused by default: "
               "they read files outside the input)");

  ckpt::cli::register_commands(app);

  // `ckptconv help [CMD]`: the same text as --help.
  CLI::App* help =
      app.add_subcommand("help", "Show the help of ckptconv or of one command (ckptconv help consolidate)");
  std::string help_topic;
  help->add_option("CMD", help_topic, "A command");
  CLI::App* version =
      app.add_subcommand("version", "Show the version, the LibTorch loaded, CUDA devices and what --device auto picks");
  ckpt::cli::register_completion(app);  // last: it describes every command above
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // 0 for --help/--version; every usage error is 2 (README "Exit codes"),
    // although CLI11 has its own codes for some (105 for a value outside
    // IsMember), and starts with "error:" and a hint when one helps.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << ckpt::cli::usage_message(app, std::vector<std::string>(argv + 1, argv + argc), e);
    std::cerr << "Run with --help for more information.\n";
    return 2;
  }
  if (help->parsed()) {
    if (help_topic.empty()) {  // app.help() would describe the selected `help` itself
      std::cout << app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal);
      return 0;
    }
    try {
      CLI::App* topic = app.get_subcommand(help_topic);
      std::cout << app.get_formatter()->make_help(topic, app.get_name() + " " + topic->get_name(),
                                                  CLI::AppFormatMode::Normal);
      return 0;
    } catch (const CLI::OptionNotFound&) {
      std::cerr << "error: no command '" << help_topic << "'\n";
      std::string hint = ckpt::cli::usage_hint(app, {help_topic});
      if (!hint.empty()) std::cerr << hint << "\n";
      return 2;
    }
  }
  ckpt::setup_logging(quiet ? ckpt::Verbosity::kQuiet : verbose ? ckpt::Verbosity::kVerbose : ckpt::Verbosity::kNormal);
  ckpt::configure_progress(quiet);
  if (app.get_subcommands().empty()) {
    std::cout << app.help();
    return 2;
  }
  if (version->parsed()) {
    std::cout << ckpt::jobs::runtime_text() << "\n";
    return 0;
  }
  ckpt::install_interrupt_handlers();
  std::string command = app.get_subcommands().front()->get_name();
  try {
    ckpt::InputBudgets budgets;
    for (const auto& limit : limits) ckpt::apply_limit(budgets, limit);
    budgets.follow_links = follow_links;
    ckpt::set_input_budgets(budgets);
    return ckpt::cli::run_selected(app);
  } catch (const ckpt::Error& e) {
    if (e.code() == ckpt::ErrorCode::kInterrupted) {
      int sig = ckpt::interrupted_signal();
      // A job that leaves something on purpose says so in the error (a
      // --part worker: the parts' shared folder); every other one left nothing.
      std::string what = e.what();
      const CLI::App* sub = app.get_subcommands().front();
      const bool writes = command != "inspect" && command != "diff" &&
                          !(command == "validate" && sub->get_option("--write-manifest")->count() == 0);
      std::string left = what.find("nothing was written at ") != std::string::npos ? what
                         : writes ? std::string("nothing was written (the temporary output was removed)")
                                  : std::string("it writes nothing");
      spdlog::error("{} interrupted by {}: {}", command, ckpt::signal_name(sig), left);
      return 128 + sig;
    }
    spdlog::error("{}", e.what());
    return ckpt::exit_code_for(e.code());
  } catch (const nlohmann::json::type_error& e) {
    // 316: a string that is not UTF-8 reached a JSON writer (an HDF5 or
    // DCP-HF output's keys): Python pickles a lone surrogate, JSON cannot
    // hold it. The input's content, not a bug; the safetensors writer
    // names the tensor before this.
    if (e.id != 316) {
      spdlog::error("internal error: {}", e.what());
      return 5;
    }
    spdlog::error(
        "a name or string of the checkpoint is not valid UTF-8 (a lone surrogate Python's pickle "
        "keeps): this output stores names as JSON and cannot hold it; write .pt instead ({})",
        e.what());
    return ckpt::exit_code_for(ckpt::ErrorCode::kUnimplemented);
  } catch (const std::bad_alloc&) {
    spdlog::error("out of memory (lower --memory-limit or --threads, or free memory)");
    return ckpt::exit_code_for(ckpt::ErrorCode::kResourceExhausted);
  } catch (const std::exception& e) {
    spdlog::error("internal error: {}", e.what());
    return 5;
  }
}
