#include "cli/completion.h"

#include <iostream>
#include <memory>
#include <sstream>
#include <vector>

#include "cli/commands.h"

namespace ckpt::cli {
namespace {

// The commands a user sees: every subcommand but the hidden ones (group "").
std::vector<const CLI::App*> visible_commands(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App* sub) { return !sub->get_group().empty(); });
}

std::vector<const CLI::Option*> named_options(const CLI::App& app) {
  std::vector<const CLI::Option*> out;
  for (const CLI::Option* opt : app.get_options())
    if (!opt->get_positional() && !opt->get_group().empty()) out.push_back(opt);
  return out;
}

// Every spelling of an option: "-o", "--output".
std::vector<std::string> spellings(const CLI::Option& opt) {
  std::vector<std::string> out;
  for (const auto& s : opt.get_snames()) out.push_back("-" + s);
  for (const auto& l : opt.get_lnames()) out.push_back("--" + l);
  return out;
}

// --tag takes a tag of the first SRC (1), --tag-b one of the second (2).
int tag_side(const CLI::Option& opt) {
  for (const auto& l : opt.get_lnames()) {
    if (l == "tag") return 1;
    if (l == "tag-b") return 2;
  }
  return 0;
}

// Flags take no value (CLI11 gives them no type name and expects 0 items).
bool takes_value(const CLI::Option& opt) { return opt.get_items_expected_min() > 0 || opt.get_expected_max() > 0; }

// The values of an IsMember check, as CLI11 shows them: "TEXT:{a,b,c}=a".
std::vector<std::string> choices(const CLI::Option& opt) {
  std::string type = opt.get_type_name();
  auto open = type.find('{'), close = type.find('}');
  std::vector<std::string> out;
  if (open == std::string::npos || close == std::string::npos || close < open) return out;
  std::stringstream in(type.substr(open + 1, close - open - 1));
  for (std::string v; std::getline(in, v, ',');) out.push_back(v);
  return out;
}

std::string joined(const std::vector<std::string>& items, const char* sep = " ") {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

// Single quotes for shells: 'it'\''s'.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// roff-safe text: backslashes and leading dots or quotes escaped.
std::string roff(const std::string& s) {
  std::string out;
  bool line_start = true;
  for (char c : s) {
    if (c == '\\') {
      out += "\\e";
    } else if (line_start && (c == '.' || c == '\'')) {
      out += "\\&";
      out += c;
    } else if (c == '-') {
      out += "\\-";
    } else {
      out += c;
    }
    line_start = c == '\n';
  }
  return out;
}

}  // namespace

std::string bash_completion(const CLI::App& app) {
  std::ostringstream s;
  std::vector<std::string> commands;
  for (const CLI::App* sub : visible_commands(app)) commands.push_back(sub->get_name());
  std::vector<std::string> global;
  for (const CLI::Option* opt : named_options(app))
    for (const auto& sp : spellings(*opt)) global.push_back(sp);
  s << "# bash completion for ckptconv, generated from its CLI definition (ckptconv completion bash)\n"
    << "_ckptconv() {\n"
    << "  local cur prev cmd i\n"
    << "  cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
    << "  prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
    << "  cmd=\"\"\n"
    << "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
    << "    case \"${COMP_WORDS[i]}\" in " << joined(commands, "|") << ") cmd=\"${COMP_WORDS[i]}\"; break;; esac\n"
    << "  done\n"
    << "  local opts values=\"\" takes=\"\" words=\"\" tagof=\"\"\n"
    << "  case \"$cmd\" in\n";
  auto option_block = [&](const CLI::App& scope, const std::string& pattern) {
    std::vector<std::string> all = global, valued;
    if (&scope != &app)
      for (const CLI::Option* opt : named_options(scope))
        for (const auto& sp : spellings(*opt)) all.push_back(sp);
    s << "    " << pattern << ")\n      opts=" << quoted(joined(all)) << "\n      case \"$prev\" in\n";
    std::vector<const CLI::Option*> opts = named_options(app);
    if (&scope != &app)
      for (const CLI::Option* opt : named_options(scope)) opts.push_back(opt);
    for (const CLI::Option* opt : opts) {
      if (!takes_value(*opt)) continue;
      auto values = choices(*opt);
      std::string action = values.empty() ? std::string("takes=1") : "values=" + quoted(joined(values));
      if (int side = tag_side(*opt)) action = "tagof=" + std::to_string(side);
      s << "        " << joined(spellings(*opt), "|") << ") " << action << ";;\n";
    }
    s << "      esac\n";
    for (const CLI::Option* opt : scope.get_options())  // a positional with a value list (completion SHELL)
      if (&scope != &app && opt->get_positional() && !choices(*opt).empty())
        s << "      words=" << quoted(joined(choices(*opt))) << "\n";
    s << "      ;;\n";
  };
  for (const CLI::App* sub : visible_commands(app)) option_block(*sub, sub->get_name());
  option_block(app, "*");
  s << "  esac\n"
    << "  if [[ -n \"$values\" ]]; then COMPREPLY=($(compgen -W \"$values\" -- \"$cur\")); return; fi\n"
    // --tag (--tag-b): the tags of the first (second) folder on the line, as
    // `ckptconv inspect SRC --tags` lists them.
    << "  if [[ -n \"$tagof\" ]]; then\n"
    << "    local src=\"\" n=0\n"
    << "    for ((i = 1; i < COMP_CWORD - 1; i++)); do\n"
    << "      case \"${COMP_WORDS[i-1]}\" in -o|--output) continue;; esac\n"
    << "      if [[ -e \"${COMP_WORDS[i]}\" ]]; then n=$((n + 1)); [[ $n == \"$tagof\" ]] && src=\"${COMP_WORDS[i]}\"; "
       "fi\n"
    << "    done\n"
    // Tag names come from folder names, which a checkpoint's author chose: they
    // are never handed to compgen -W (which expands $(...) in its word list),
    // only compared as strings and offered quoted (%q), so neither completing
    // nor running the completed line evaluates them.
    << "    [[ -n \"$src\" ]] || return\n"
    << "    local tag quoted\n"
    << "    while IFS= read -r tag; do\n"
    << "      [[ \"$tag\" == \"$cur\"* ]] || continue\n"
    << "      printf -v quoted '%q' \"$tag\"; COMPREPLY+=(\"$quoted\")\n"
    << "    done < <(\"${COMP_WORDS[0]}\" inspect \"$src\" --tags 2>/dev/null)\n"
    << "    return\n"
    << "  fi\n"
    << "  if [[ -n \"$takes\" ]]; then COMPREPLY=($(compgen -f -- \"$cur\")); compopt -o filenames 2>/dev/null; "
       "return; "
       "fi\n"
    << "  if [[ \"$cur\" == -* ]]; then COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\")); return; fi\n"
    << "  if [[ -z \"$cmd\" ]]; then COMPREPLY=($(compgen -W " << quoted(joined(commands))
    << " -- \"$cur\")); return; fi\n"
    << "  if [[ -n \"$words\" ]]; then COMPREPLY=($(compgen -W \"$words\" -- \"$cur\")); return; fi\n"
    << "  COMPREPLY=($(compgen -f -- \"$cur\")); compopt -o filenames 2>/dev/null\n"
    << "}\n"
    << "complete -F _ckptconv ckptconv\n";
  return s.str();
}

std::string zsh_completion(const CLI::App& app) {
  std::ostringstream s;
  s << "#compdef ckptconv\n"
    << "# zsh completion for ckptconv, generated from its CLI definition (ckptconv completion zsh)\n\n"
    // --tag N: the tags of the N-th folder on the line (ckptconv inspect SRC --tags).
    << "_ckptconv_tags() {\n"
    << "  local w src prev n=0\n  local -a tags\n"
    << "  for w in ${words[2,CURRENT-1]}; do\n"
    << "    if [[ -e $w && $prev != (-o|--output) ]]; then n=$((n + 1)); [[ $n == $1 ]] && src=$w; fi\n"
    << "    prev=$w\n"
    << "  done\n"
    << "  [[ -n $src ]] && tags=(${(f)\"$(ckptconv inspect $src --tags 2>/dev/null)\"})\n"
    << "  compadd -a tags\n"
    << "}\n\n";
  auto spec = [](const CLI::Option& opt) {
    // '(-o --output)'{-o,--output}'[Output file]:value:_files'
    std::string desc = opt.get_description();
    for (char& c : desc)
      if (c == '[' || c == ']' || c == '\'' || c == ':' || c == '\n') c = ' ';
    auto names = spellings(opt);
    std::string tail = "[" + desc + "]";
    if (takes_value(opt)) {
      auto values = choices(opt);
      if (int side = tag_side(opt))
        tail += ":tag:{_ckptconv_tags " + std::to_string(side) + "}";
      else
        tail += values.empty() ? ":value:_files" : ":value:(" + joined(values) + ")";
    }
    if (names.size() == 1) return "'" + names[0] + tail + "'";
    return "'(" + joined(names) + ")'{" + joined(names, ",") + "}'" + tail + "'";
  };
  for (const CLI::App* sub : visible_commands(app)) {
    s << "_ckptconv_" << sub->get_name() << "() {\n  _arguments -s \\\n";
    for (const CLI::Option* opt : named_options(*sub)) s << "    " << spec(*opt) << " \\\n";
    s << "    '*:file:_files'\n}\n\n";
  }
  s << "_ckptconv() {\n  local line state\n  _arguments -C \\\n";
  for (const CLI::Option* opt : named_options(app)) s << "    " << spec(*opt) << " \\\n";
  s << "    '1: :->command' \\\n    '*::arg:->args'\n"
    << "  case $state in\n    command)\n      local -a commands\n      commands=(\n";
  for (const CLI::App* sub : visible_commands(app)) {
    std::string desc = sub->get_description();
    for (char& c : desc)
      if (c == '\'' || c == ':' || c == '\n') c = ' ';
    s << "        '" << sub->get_name() << ":" << desc << "'\n";
  }
  s << "      )\n      _describe 'command' commands\n      ;;\n    args)\n      case $line[1] in\n";
  for (const CLI::App* sub : visible_commands(app))
    s << "        " << sub->get_name() << ") _ckptconv_" << sub->get_name() << " ;;\n";
  s << "      esac\n      ;;\n  esac\n}\n\n_ckptconv \"$@\"\n";
  return s.str();
}

std::string man_page(const CLI::App& app) {
  std::ostringstream s;
  auto options = [&](const CLI::App& scope) {
    for (const CLI::Option* opt : scope.get_options()) {
      if (opt->get_group().empty()) continue;
      std::string names = opt->get_positional() ? opt->get_name() : joined(spellings(*opt), ", ");
      if (!opt->get_positional() && takes_value(*opt)) {
        auto values = choices(*opt);
        names += " " + (values.empty() ? std::string("VALUE") : "{" + joined(values, ",") + "}");
      }
      s << ".TP\n.B " << roff(names) << "\n" << roff(opt->get_description()) << "\n";
    }
  };
  s << ".TH CKPTCONV 1 \"\" \"ckptconv " CKPT_VERSION "\" \"User Commands\"\n"
    << ".SH NAME\nckptconv \\- " << roff(app.get_description().substr(app.get_description().find(':') + 2)) << "\n"
    << ".SH SYNOPSIS\n.B ckptconv\n[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fISRC\\fR]\n"
    << ".SH DESCRIPTION\n"
    << roff(app.get_description()) << "\n"
    << ".SH GLOBAL OPTIONS\n";
  options(app);
  s << ".SH COMMANDS\n";
  for (const CLI::App* sub : visible_commands(app)) {
    s << ".SS " << sub->get_name() << "\n" << roff(sub->get_description()) << "\n";
    options(*sub);
    if (!sub->get_footer().empty()) s << ".PP\n.nf\n" << roff(sub->get_footer()) << "\n.fi\n";
  }
  s << ".SH EXIT STATUS\n.nf\n"
    << roff(app.get_footer()) << "\n.fi\n"
    << ".SH ENVIRONMENT\n"
    << ".TP\n.B CKPTCONV_LIBTORCH\nThe torch lib folder (or torch package folder) to load LibTorch from; then "
       "\\fB$VIRTUAL_ENV\\fR and \\fB$CONDA_PREFIX\\fR are searched, then the build's own LibTorch.\n"
    << ".TP\n.B CKPT_TORCH_PLUGIN, CKPT_TORCH_CUDA_PLUGIN\nPaths of the LibTorch plugins, when not beside the binary "
       "or in ../lib/ckptconv.\n"
    << ".TP\n.B NO_COLOR\nNo colours in log lines.\n"
    << ".SH SEE ALSO\nThe project's README.md and docs/ (usage.md, safety.md, install.md).\n";
  return s.str();
}

void register_completion(CLI::App& app) {
  auto shell = std::make_shared<std::string>();
  CLI::App* completion = app.add_subcommand(
      "completion", "Print a shell completion script: ckptconv completion bash > /etc/bash_completion.d/ckptconv");
  completion->add_option("SHELL", *shell, "bash or zsh")->required()->check(CLI::IsMember({"bash", "zsh"}));
  add_runner(completion, [&app, shell] {
    std::cout << (*shell == "bash" ? bash_completion(app) : zsh_completion(app));
    return 0;
  });
  CLI::App* man = app.add_subcommand("man", "Print the man page (roff)");
  man->group("");  // hidden: the build runs it
  add_runner(man, [&app] {
    std::cout << man_page(app);
    return 0;
  });
}

}  // namespace ckpt::cli
