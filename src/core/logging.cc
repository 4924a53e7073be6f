#include "core/logging.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>

#include "core/progress.h"

namespace ckpt {
namespace {

// https://no-color.org: set and not empty means no ANSI colors.
bool no_color_requested() {
  const char* v = std::getenv("NO_COLOR");
  return v && *v;
}

// Writes each message through `inner` with the progress line erased, so a
// log line never lands in the middle of a progress line (core/progress.h).
class ProgressAwareSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ProgressAwareSink(spdlog::sink_ptr inner) : inner_(std::move(inner)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    with_progress_line_erased([&] { inner_->log(msg); });
  }
  void flush_() override { inner_->flush(); }
  void set_pattern_(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter_(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  spdlog::sink_ptr inner_;
};

}  // namespace

void setup_logging(Verbosity verbosity) {
  // Colors (the level name only) when stderr is a terminal, unless NO_COLOR.
  auto mode = no_color_requested() ? spdlog::color_mode::never : spdlog::color_mode::automatic;
  auto color_sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(mode);
  auto logger = std::make_shared<spdlog::logger>("ckptconv", std::make_shared<ProgressAwareSink>(color_sink));
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
bool verbose() { return spdlog::should_log(spdlog::level::debug); }
}  // namespace ckpt::log
