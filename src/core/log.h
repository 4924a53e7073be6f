// Logging that takes finished strings, for translation units that must not
// include spdlog (those that include LibTorch, whose bundled fmt clashes).
#pragma once

#include <string>

namespace ckpt::log {
void debug(const std::string& message);
void info(const std::string& message);
void warn(const std::string& message);
// True under -v: outputs meant for a user (a --dry-run plan) add detail.
bool verbose();
}  // namespace ckpt::log
