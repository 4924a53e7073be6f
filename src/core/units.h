// Parsing of sizes given on the command line: "512M", "2GiB", "1500000".
#pragma once

#include <cstdint>
#include <string>

namespace ckpt {

// Suffixes K, M, G, T (powers of 1024, optional "i"/"B"); InvalidArgument otherwise.
uint64_t parse_size(const std::string& text);

}  // namespace ckpt
