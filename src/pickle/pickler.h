// Protocol-2 pickler for Value trees, producing streams that
// torch.load(weights_only=True) accepts: only protocol-2 opcodes, globals as
// GLOBAL, OrderedDict as `collections.OrderedDict()` + SETITEMS, persistent
// ids as BINPERSID, shared ValuePtrs memoized (BINPUT/BINGET) so a storage
// referenced twice is one object again when loaded.
#pragma once

#include <string>

#include "pickle/value.h"

namespace ckpt::pickle {

std::string pickle_protocol2(const Value& root);

}  // namespace ckpt::pickle
