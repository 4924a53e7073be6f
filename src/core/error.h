// The one error type of ckptconv: a code that means something, a message, and
// a context chain (file -> rank -> tensor) that grows as the error propagates.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckpt {

enum class ErrorCode {
  kInvalidArgument,    // the request is wrong (usage, options)        -> exit 2
  kNotFound,           // an input file or key does not exist          -> exit 3
  kDataLoss,           // input bytes are corrupt or truncated         -> exit 3
  kUnsafe,             // input asks for something we refuse to do     -> exit 3
  kUnimplemented,      // input uses a feature we do not support       -> exit 3
  kOutputFailed,       // the output could not be written              -> exit 4
  kResourceExhausted,  // a memory or size limit stops the work        -> exit 4
  kInternal,           // a bug in ckptconv                            -> exit 5
  kInstallation,       // a plugin or LibTorch is missing or unusable  -> exit 5
  kInterrupted,        // SIGINT / SIGTERM / SIGHUP stopped the work   -> exit 128 + signal
};

const char* error_code_name(ErrorCode code);
// The process exit code documented in the README for an error of this code.
int exit_code_for(ErrorCode code);

// Where an error happened, as far as the layers it passed knew: the file, the
// rank that wrote it, the tensor (dotted key). Validate's problems are built
// from it (core/problems.h).
struct Place {
  std::string file;
  int rank = -1;
  std::string tensor;
};

// `text` as valid UTF-8 without control characters (newline and tab kept):
// every other byte is written as \xNN. Messages quote names and values read
// from untrusted files; what the tool prints (and JSON, which must be UTF-8)
// stays readable whatever the file held.
std::string printable_text(std::string_view text);

class Error : public std::exception {
 public:
  Error(ErrorCode code, std::string message);

  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Outermost context first, e.g. {"file ckpt/__0_0.distcp", "tensor model.w"}.
  const std::vector<std::string>& context() const { return context_; }

  // Adds an outer context item; called by code further up the stack.
  Error& add_context(std::string item);

  const Place& place() const { return place_; }
  // Fills the parts of the place still unknown: the innermost layer that
  // knows a part is the most precise, so outer layers never overwrite it.
  Error& note_place(const Place& place);

  // "ctx1: ctx2: message"
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  void rebuild_what();

  ErrorCode code_;
  std::string message_;
  std::vector<std::string> context_;
  Place place_;
  std::string what_;
};

[[noreturn]] void fail(ErrorCode code, std::string message);
[[noreturn]] inline void fail_data_loss(std::string message) { fail(ErrorCode::kDataLoss, std::move(message)); }
[[noreturn]] inline void fail_invalid(std::string message) { fail(ErrorCode::kInvalidArgument, std::move(message)); }

// Runs fn; an ckpt::Error escaping it gets `item` added as outer context.
template <class Fn>
decltype(auto) with_context(const std::string& item, Fn&& fn) {
  try {
    return fn();
  } catch (Error& e) {
    e.add_context(item);
    throw;
  }
}

// Runs fn; an ckpt::Error escaping it gets the parts of `place` it does not
// know yet (no text is added: pair with with_context for the message).
template <class Fn>
decltype(auto) with_place(const Place& place, Fn&& fn) {
  try {
    return fn();
  } catch (Error& e) {
    e.note_place(place);
    throw;
  }
}

}  // namespace ckpt
