// The registered input formats (formats/input_format.h), and the lookups
// detect and the layers above make in them.
#pragma once

#include <vector>

#include "formats/input_format.h"

namespace ckpt {

// Every input format this build reads, in no particular order: probes decide
// by confidence, not by position.
const std::vector<const InputFormat*>& input_formats();

// The descriptor of `kind` (Internal error for a kind no format registers).
const InputFormat& input_format(SourceKind kind);

}  // namespace ckpt
