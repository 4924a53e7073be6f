#include "core/budgets.h"

#include <algorithm>

#include "core/error.h"
#include "core/units.h"

namespace ckpt {

namespace {
InputBudgets g_budgets;
}

const InputBudgets& input_budgets() { return g_budgets; }
void set_input_budgets(const InputBudgets& budgets) { g_budgets = budgets; }

void apply_limit(InputBudgets& budgets, const std::string& name_eq_value) {
  auto eq = name_eq_value.find('=');
  std::string name = name_eq_value.substr(0, eq);
  std::string value = eq == std::string::npos ? "" : name_eq_value.substr(eq + 1);
  uint64_t* target = name == "pickle-memory"  ? &budgets.pickle_memory
                     : name == "pickle-stack" ? &budgets.pickle_stack
                     : name == "tree-values"  ? &budgets.tree_values
                     : name == "hdf5-memory"  ? &budgets.hdf5_memory
                                              : nullptr;
  if (!target || value.empty()) {
    fail(ErrorCode::kInvalidArgument, "--limit '" + name_eq_value +
                                          "': expected NAME=VALUE with NAME one of pickle-memory, pickle-stack, "
                                          "tree-values, hdf5-memory (docs/limits.md)");
  }
  uint64_t n = with_context("--limit " + name, [&] { return parse_size(value); });  // names the option
  if (n == 0) fail(ErrorCode::kInvalidArgument, "--limit " + name + " must be positive");
  *target = n;
}

uint64_t pickle_memory_budget(uint64_t pickle_bytes) {
  if (g_budgets.pickle_memory) return g_budgets.pickle_memory;
  return kPickleMemoryBase + kPickleMemoryPerByte * pickle_bytes;
}

uint64_t hdf5_memory_budget(uint64_t file_bytes) {
  if (g_budgets.hdf5_memory) return g_budgets.hdf5_memory;
  return kHdf5MemoryBase + kHdf5MemoryPerByte * std::min(file_bytes, uint64_t{1} << 40);
}

std::string budget_hint(const std::string& name) {
  return "raise it with --limit " + name + "=VALUE for trusted input";
}

}  // namespace ckpt
