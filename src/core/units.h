// Sizes given on the command line ("512M", "2GiB", "1500000") and sizes
// shown to people ("1.5 MiB").
#pragma once

#include <cstdint>
#include <string>

namespace ckpt {

// Suffixes K, M, G, T (powers of 1024, optional "i"/"B"); InvalidArgument otherwise.
uint64_t parse_size(const std::string& text);

// "0 B", "512 B", "1.5 KiB", "12.0 MiB", ... (powers of 1024). A double so
// that rates (bytes per second) print the same way.
std::string human_bytes(double bytes);

}  // namespace ckpt
