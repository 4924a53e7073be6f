#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace ckpt {

void setup_logging(Verbosity verbosity) {
  auto logger = spdlog::stderr_color_mt("ckptconv");
  logger->set_pattern("%^%l%$: %v");
  switch (verbosity) {
    case Verbosity::kQuiet: logger->set_level(spdlog::level::err); break;
    case Verbosity::kNormal: logger->set_level(spdlog::level::info); break;
    case Verbosity::kVerbose: logger->set_level(spdlog::level::debug); break;
  }
  spdlog::set_default_logger(logger);
}

}  // namespace ckpt

#include "core/log.h"

namespace ckpt::log {
void debug(const std::string& message) { spdlog::debug("{}", message); }
void info(const std::string& message) { spdlog::info("{}", message); }
void warn(const std::string& message) { spdlog::warn("{}", message); }
}  // namespace ckpt::log
