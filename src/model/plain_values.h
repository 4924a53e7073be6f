// The gate between what a reader decoded and what a writer may copy into an
// output: every value in a model's tree must be plain data. ckptconv writes
// outputs from the decoded model, never by copying pickle bytes, and torch
// loads those outputs with the real pickle machine; so an object the readers
// did not turn into a tensor or plain data (a dataclass record, a path, a
// call of anything but torch.Size/torch.device) is refused, not passed on.
#pragma once

#include "pickle/value.h"

namespace ckpt {

// Throws Unsafe naming the dotted path of the first value that is not plain
// data: None, bool, numbers, str, bytes, tuple, list, dict (an OrderedDict
// with attributes too), set, a tensor reference, a torch.* global (dtypes,
// layouts), torch.Size(...) or torch.device(...). Each node is visited once,
// iteratively: shared subtrees and deep nesting cost no more than the graph.
void require_plain_values(const pickle::Value& root);

}  // namespace ckpt
