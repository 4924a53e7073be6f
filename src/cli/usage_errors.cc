#include "cli/usage_errors.h"

#include <algorithm>

#include "jobs/source_kinds.h"

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

std::vector<const CLI::Option*> named_options(const CLI::App& app) {
  std::vector<const CLI::Option*> out;
  for (const CLI::Option* o : app.get_options())
    if (!o->get_lnames().empty() || !o->get_snames().empty()) out.push_back(o);
  return out;
}

std::vector<std::string> long_names(const std::vector<const CLI::Option*>& options) {
  std::vector<std::string> out;
  for (const CLI::Option* o : options)
    for (const auto& name : o->get_lnames()) out.push_back("--" + name);
  return out;
}

bool takes_value(const CLI::Option& o) { return o.get_items_expected_min() > 0 || o.get_expected_max() > 0; }

// The option `word` spells ("--tag", "--tag=x", "-o"), or null.
const CLI::Option* option_named(const std::vector<const CLI::Option*>& options, const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return nullptr;
  std::string name = word.substr(0, word.find('='));
  for (const CLI::Option* o : options) {
    if (name.rfind("--", 0) == 0) {
      for (const auto& l : o->get_lnames())
        if (name == "--" + l) return o;
    } else {
      for (const auto& s : o->get_snames())
        if (name == "-" + s) return o;
    }
  }
  return nullptr;
}

// The values an IsMember check allows ("TEXT:{model,optim}"), for
// "--only-model" -> "--only model".
std::vector<std::string> choices(const CLI::Option& o) {
  std::string type = o.get_type_name();
  auto open = type.find('{'), close = type.find('}');
  std::vector<std::string> out;
  if (open == std::string::npos || close == std::string::npos || close < open) return out;
  std::string list = type.substr(open + 1, close - open - 1);
  for (std::size_t at = 0; at <= list.size();) {
    std::size_t comma = std::min(list.find(',', at), list.size());
    out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// What an unknown long option most likely meant: an option and its value run
// together ("--only-model": "--only model"), a longer spelling of an option
// ("--output-file": "--output"), else the closest name.
std::string suggestion_for(const std::string& name, const std::vector<const CLI::Option*>& options) {
  for (const CLI::Option* o : options)
    for (const auto& l : o->get_lnames()) {
      std::string known = "--" + l;
      if (name.size() <= known.size() + 1 || name.compare(0, known.size(), known) != 0) continue;
      char sep = name[known.size()];
      if (sep != '-' && sep != '_') continue;
      std::string rest = name.substr(known.size() + 1);
      for (const auto& v : choices(*o))
        if (v == rest) return known + " " + v;
      if (takes_value(*o) && choices(*o).empty()) return known;
    }
  return closest(name, long_names(options));
}

// Words after the command, sorted into unknown options and positionals
// (values of options that take one are skipped).
struct Typed {
  std::vector<std::string> unknown_options;
  std::vector<std::string> positionals;
};

Typed sort_words(std::vector<std::string>::const_iterator begin, std::vector<std::string>::const_iterator end,
                 const std::vector<const CLI::Option*>& options) {
  Typed out;
  for (auto it = begin; it != end; ++it) {
    const std::string& a = *it;
    if (a == "--") {
      out.positionals.insert(out.positionals.end(), it + 1, end);
      break;
    }
    if (a.size() > 1 && a[0] == '-') {
      const CLI::Option* o = option_named(options, a);
      if (!o) {
        out.unknown_options.push_back(a.substr(0, a.find('=')));
      } else if (takes_value(*o) && a.find('=') == std::string::npos) {
        // A value (or several: --files) follows until the next option.
        int max = o->get_expected_max();
        for (int n = 0; (max < 0 || n < std::max(max, 1)) && it + 1 != end && (*(it + 1))[0] != '-'; ++n) ++it;
      }
      continue;
    }
    out.positionals.push_back(a);
  }
  return out;
}

// The first word that is not an option or a global option's value: the command.
std::vector<std::string>::const_iterator command_word(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<const CLI::Option*> global = named_options(app);
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (it->empty() || (*it)[0] != '-') return it;
    const CLI::Option* o = option_named(global, *it);
    if (o && takes_value(*o) && it->find('=') == std::string::npos && it + 1 != args.end()) ++it;
  }
  return args.end();
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

}  // namespace

std::string usage_hint(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands({})) commands.push_back(sub->get_name());
  auto first = command_word(app, args);
  if (first == args.end()) return "";
  CLI::App* sub = nullptr;
  if (std::find(commands.begin(), commands.end(), *first) != commands.end()) {
    sub = app.get_subcommand(*first);
  } else {
    std::string guess = closest(*first, commands);
    if (!guess.empty()) return "did you mean '" + guess + "'? (ckptconv help lists the commands)";
    return "ckptconv help lists the commands";
  }
  std::vector<const CLI::Option*> options = named_options(*sub);
  for (const CLI::Option* o : named_options(app)) options.push_back(o);
  Typed typed = sort_words(first + 1, args.end(), options);
  std::string hints;
  for (const auto& name : typed.unknown_options) {
    std::string guess = suggestion_for(name, options);
    if (!guess.empty()) hints += "did you mean '" + guess + "' for '" + name + "'?\n";
  }
  std::size_t files = 0;
  for (const auto& a : typed.positionals)
    if (jobs::is_file_path(a)) ++files;
  if (files > 2)
    hints +=
        "several files were given where one SRC is expected: if the shell expanded a glob, quote it "
        "('dir/*rank*.pt') or list the files with --files\n";
  if (!hints.empty()) hints.pop_back();
  return hints;
}

std::string usage_message(CLI::App& app, const std::vector<std::string>& args, const CLI::ParseError& error) {
  std::string first_line = std::string("error: ") + error.what();
  auto first = command_word(app, args);
  CLI::App* sub = nullptr;
  if (first != args.end()) {
    try {
      sub = app.get_subcommand(*first);
    } catch (const CLI::OptionNotFound&) {
      // Not a command: say so first, whatever CLI11 made of the words.
      first_line = "error: '" + *first + "' is not a ckptconv command";
    }
  }
  if (sub) {
    std::vector<const CLI::Option*> options = named_options(*sub);
    for (const CLI::Option* o : named_options(app)) options.push_back(o);
    Typed typed = sort_words(first + 1, args.end(), options);
    // An unknown option explains the rest (CLI11 may first say a required
    // option is missing: --output-file instead of --output).
    if (!typed.unknown_options.empty()) {
      first_line = "error: " + sub->get_name() + " has no option " + joined(typed.unknown_options);
    } else if (dynamic_cast<const CLI::ExtrasError*>(&error)) {
      std::size_t takes = 0;
      for (const CLI::Option* o : sub->get_options())
        if (o->get_positional()) takes += static_cast<std::size_t>(std::max(o->get_expected_max(), 1));
      if (typed.positionals.size() > takes)
        first_line = "error: " + sub->get_name() + " takes " + std::to_string(takes) + " argument" +
                     (takes == 1 ? "" : "s") + ", got " + std::to_string(typed.positionals.size()) + ": " +
                     joined(typed.positionals);
    }
  }
  std::string hint = usage_hint(app, args);
  return first_line + "\n" + (hint.empty() ? "" : hint + "\n");
}

}  // namespace ckpt::cli
