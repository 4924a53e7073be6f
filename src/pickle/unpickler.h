// Safe unpickler: every opcode of protocols 0-5 into a Value tree, bounded,
// executing nothing. Corrupt or truncated input is DataLoss, a refused global
// is Unsafe naming "module.name", structural limits exceeded are DataLoss,
// and a memory or stack budget exceeded is Unsafe naming the budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/byte_source.h"
#include "pickle/policy.h"
#include "pickle/value.h"

namespace ckpt::pickle {

struct UnpickleLimits {
  std::size_t max_depth = 512;             // nesting of containers / marks
  std::size_t max_memo = 1u << 22;         // memo entries
  std::size_t max_container = 1u << 26;    // elements in one container
  uint64_t max_total_values = 1ull << 28;  // values created in one stream
  // 0: the process-wide budgets (core/budgets.h), the memory one scaled by
  // the pickle's size.
  uint64_t max_bytes = 0;  // decoded values, containers, memo and stack, as counted
  uint64_t max_stack = 0;  // values on the stack at once
};

ValuePtr unpickle(std::string_view bytes, const GlobalPolicy& policy, const UnpickleLimits& limits = {});
// Reads the whole source (a zip record, a .metadata file) then unpickles it.
ValuePtr unpickle(const ByteSource& source, const GlobalPolicy& policy, const UnpickleLimits& limits = {});

}  // namespace ckpt::pickle
