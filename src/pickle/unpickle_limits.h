// The bounds one unpickle runs under (pickle/unpickler.h), apart so that
// the machine's detail header (unpickler_machine.h) needs no more of the
// public header than these.
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace ckpt::pickle
