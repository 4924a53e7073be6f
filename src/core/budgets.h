// Budgets on what an input file can make the tool spend while it is decoded.
// Every one has a default far above what real checkpoints need (measured on
// the largest state dicts we can make) and far below what a small hostile
// file could otherwise ask for; exceeding one is Unsafe (exit 3) with a
// message that names it and the option that raises it for trusted input
// (`--limit NAME=VALUE`, docs/limits.md).
#pragma once

#include <cstdint>
#include <string>

namespace ckpt {

struct InputBudgets {
  // Memory one pickle may take once decoded: values, containers, memo and
  // stack, as the unpickler counts them. 0 means the default, scaled by the
  // pickle's size: kPickleMemoryBase + kPickleMemoryPerByte x its bytes.
  uint64_t pickle_memory = 0;
  // Values on the unpickler's stack at once. torch's pickler batches
  // containers by 1,000, so a real checkpoint's stack stays in the thousands.
  uint64_t pickle_stack = uint64_t{1} << 20;
  // Values in a decoded tree counted once per path that reaches them (what a
  // walk over the tree visits); a subtree shared k times counts k times.
  uint64_t tree_values = uint64_t{1} << 24;
  // Memory libhdf5 may take reading an HDF5 file's structure, in the child
  // process that isolates it (io/isolate.h): what a corrupt size can make it
  // allocate. 0 means the default, kHdf5MemoryBase + kHdf5MemoryPerByte x
  // the file's bytes.
  uint64_t hdf5_memory = 0;
  // --follow-links: read symlinks that leave the checkpoint's directory and
  // HDF5 external links (refused by default: they read outside the input).
  bool follow_links = false;
};

// Measured on the largest real pickles we make: a torch.save of 100,000
// tensors (9.6 MB of pickle) decodes to 34x its size as counted here, the
// DCP .metadata of 100,000 tensors (19.7 MB) to 58x. 128x leaves room; the
// 64 MiB base covers small pickles whose few values cost more than their bytes.
inline constexpr uint64_t kPickleMemoryBase = uint64_t{64} << 20;
inline constexpr uint64_t kPickleMemoryPerByte = 128;

// 100,000 datasets of 4x4 floats (a 50 MB file) take 0.3 GB to read, 6x;
// 16x leaves room, and the base covers files of a few tensors.
inline constexpr uint64_t kHdf5MemoryBase = uint64_t{1} << 30;
inline constexpr uint64_t kHdf5MemoryPerByte = 16;

// The budgets in force (process-wide: set once from the command line).
const InputBudgets& input_budgets();
void set_input_budgets(const InputBudgets& budgets);

// "pickle-memory=2G", "pickle-stack=4000000", "tree-values=100000000",
// "hdf5-memory=8G" (a size
// suffix or plain digits) into `budgets`; InvalidArgument naming the known
// names otherwise.
void apply_limit(InputBudgets& budgets, const std::string& name_eq_value);

// The pickle-memory budget for a pickle of `pickle_bytes` bytes.
uint64_t pickle_memory_budget(uint64_t pickle_bytes);
// The hdf5-memory budget for an HDF5 file of `file_bytes` bytes.
uint64_t hdf5_memory_budget(uint64_t file_bytes);

// "raise it with --limit NAME=VALUE (trusted input only)", for messages.
std::string budget_hint(const std::string& name);

}  // namespace ckpt
