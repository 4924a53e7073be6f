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
#include "pickle/unpickle_limits.h"
#include "pickle/value.h"

namespace ckpt::pickle {

ValuePtr unpickle(std::string_view bytes, const GlobalPolicy& policy, const UnpickleLimits& limits = {});
// Reads the whole source (a zip record, a .metadata file) then unpickles it.
ValuePtr unpickle(const ByteSource& source, const GlobalPolicy& policy, const UnpickleLimits& limits = {});

}  // namespace ckpt::pickle
