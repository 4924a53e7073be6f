// Logging goes to stderr through spdlog; stdout is reserved for results.
#pragma once

namespace ckpt {

enum class Verbosity { kQuiet, kNormal, kVerbose };

// Installs the stderr logger; call once from main.
void setup_logging(Verbosity verbosity);

}  // namespace ckpt
