#include "cli/commands.h"

#include <map>

#include "core/error.h"

namespace ckpt::cli {
namespace {
std::map<CLI::App*, std::function<int()>>& runners() {
  static std::map<CLI::App*, std::function<int()>> table;
  return table;
}
}  // namespace

void add_runner(CLI::App* sub, std::function<int()> run) { runners()[sub] = std::move(run); }

void register_inspect(CLI::App& app);
void register_convert(CLI::App& app);
void register_consolidate(CLI::App& app);
void register_reshard(CLI::App& app);
void register_validate(CLI::App& app);
void register_diff(CLI::App& app);
void register_finalize(CLI::App& app);

void register_commands(CLI::App& app) {
  register_inspect(app);
  register_consolidate(app);
  register_convert(app);
  register_reshard(app);
  register_validate(app);
  register_diff(app);
  register_finalize(app);
}

int run_selected(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands()) {
    auto it = runners().find(sub);
    if (it != runners().end()) return it->second();
  }
  fail(ErrorCode::kInternal, "no runner for the selected subcommand");
}

}  // namespace ckpt::cli
