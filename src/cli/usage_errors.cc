#include "cli/usage_errors.h"

#include <algorithm>
#include <filesystem>

namespace ckpt::cli {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

namespace {

// The closest of `names` to `word` within a third of its length, or "".
std::string closest(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(1, word.size() / 3) + 1;
  for (const auto& n : names) {
    std::size_t d = edit_distance(word, n);
    if (d < best_d) {
      best_d = d;
      best = n;
    }
  }
  return best;
}

std::vector<std::string> long_options(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app.get_options())
    for (const auto& name : o->get_lnames()) out.push_back("--" + name);
  return out;
}

}  // namespace

std::string usage_hint(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands({})) commands.push_back(sub->get_name());
  // The subcommand: the first word that is not an option.
  auto first = std::find_if(args.begin(), args.end(), [](const std::string& a) { return a.empty() || a[0] != '-'; });
  if (first == args.end()) return "";
  CLI::App* sub = nullptr;
  if (std::find(commands.begin(), commands.end(), *first) != commands.end()) {
    sub = app.get_subcommand(*first);
  } else {
    std::string guess = closest(*first, commands);
    if (!guess.empty()) return "did you mean '" + guess + "'? (ckptconv help lists the commands)";
    return "'" + *first + "' is not a command; ckptconv help lists them";
  }
  std::vector<std::string> options = long_options(*sub);
  for (const auto& o : long_options(app)) options.push_back(o);
  std::string hints;
  std::size_t files = 0;
  for (auto it = first + 1; it != args.end(); ++it) {
    const std::string& a = *it;
    if (a.rfind("--", 0) == 0) {
      std::string name = a.substr(0, a.find('='));
      if (std::find(options.begin(), options.end(), name) == options.end()) {
        std::string guess = closest(name, options);
        if (!guess.empty()) hints += "did you mean '" + guess + "' for '" + name + "'?\n";
      }
    } else if (std::error_code ec; std::filesystem::is_regular_file(a, ec)) {
      ++files;
    }
  }
  if (files > 2)
    hints +=
        "several files were given where one SRC is expected: if the shell expanded a glob, quote it "
        "('dir/*rank*.pt') or list the files with --files\n";
  if (!hints.empty()) hints.pop_back();
  return hints;
}

}  // namespace ckpt::cli
