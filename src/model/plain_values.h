// The gate between what a reader decoded and what a writer may copy into an
// output: every value in a model's tree must be plain data. ckptconv writes
// outputs from the decoded model, never by copying pickle bytes, and torch
// loads those outputs with the real pickle machine; so an object the readers
// did not turn into a tensor or plain data (a dataclass record, a path, a
// call of anything but torch.Size/torch.device) is refused, not passed on.
#pragma once

#include <cstdint>

#include "pickle/value.h"

namespace ckpt {

// Throws Unsafe naming the dotted path of the first value that is not plain
// data: None, bool, numbers, str, bytes, tuple, list, dict (an OrderedDict
// with attributes too), set, a tensor reference, a torch.* global (dtypes,
// layouts), torch.Size(...) or torch.device(...). Each node is visited once,
// iteratively: shared subtrees and deep nesting cost no more than the graph.
void require_plain_values(const pickle::Value& root);

// Every walk above the readers (inspect, --keys, JSON, writers, diff) visits
// the tree as a tree: a subtree the pickle references from k places is walked
// k times, so 40 levels of `a = [a, a]` (1.9 KB) would be 2^40 visits. The
// expanded size (each node counted once per path that reaches it) is computed
// here in time linear in the graph; more than the tree-values budget
// (core/budgets.h, 2^24 unless --limit raises it) is Unsafe (exit 3) naming
// it. Real state dicts are far below it: a 100,000-tensor model with Adam
// state expands to about 10^6 values. limit 0: the budget in force.
void require_bounded_expansion(const pickle::Value& root, uint64_t limit = 0);

}  // namespace ckpt
