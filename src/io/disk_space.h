// Free space where an output will be written, so that a plan that cannot fit
// is refused before anything is written (a 1.6 KB checkpoint can describe a
// 4 TB tensor: a stride-0 view).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ckpt {

// Bytes an unprivileged writer may still use on the filesystem holding
// `path` (or, when it does not exist yet, its nearest existing parent);
// nullopt when the system cannot say.
std::optional<uint64_t> free_bytes_at(const std::string& path);

}  // namespace ckpt
