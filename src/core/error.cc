#include "core/error.h"

namespace ckpt {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kNotFound: return "NotFound";
    case ErrorCode::kDataLoss: return "DataLoss";
    case ErrorCode::kUnsafe: return "Unsafe";
    case ErrorCode::kUnimplemented: return "Unimplemented";
    case ErrorCode::kOutputFailed: return "OutputFailed";
    case ErrorCode::kResourceExhausted: return "ResourceExhausted";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Unknown";
}

int exit_code_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return 2;
    case ErrorCode::kNotFound:
    case ErrorCode::kDataLoss:
    case ErrorCode::kUnsafe:
    case ErrorCode::kUnimplemented: return 3;
    case ErrorCode::kOutputFailed:
    case ErrorCode::kResourceExhausted: return 4;
    case ErrorCode::kInternal: return 5;
  }
  return 5;
}

Error::Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {
  rebuild_what();
}

Error& Error::add_context(std::string item) {
  context_.insert(context_.begin(), std::move(item));
  rebuild_what();
  return *this;
}

void Error::rebuild_what() {
  what_.clear();
  for (const auto& c : context_) {
    what_ += c;
    what_ += ": ";
  }
  what_ += message_;
}

void fail(ErrorCode code, std::string message) { throw Error(code, std::move(message)); }

}  // namespace ckpt
