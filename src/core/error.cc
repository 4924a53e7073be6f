#include "core/error.h"

#include <cstdio>

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
    case ErrorCode::kInstallation: return "Installation";
    case ErrorCode::kInterrupted: return "Interrupted";
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
    case ErrorCode::kInternal:
    case ErrorCode::kInstallation: return 5;
    case ErrorCode::kInterrupted: return 130;  // main uses 128 + the signal's number
  }
  return 5;
}

std::string printable_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char c) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  };
  for (std::size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c < 0x20 && c != '\n' && c != '\t')
        escape(c);
      else if (c == 0x7f)
        escape(c);
      else
        out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A whole valid multi-byte sequence (no overlong forms, no surrogates) is kept.
    std::size_t len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 0;
    bool ok = len > 0 && i + len <= text.size();
    for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    if (ok && len == 3) {
      auto c1 = static_cast<unsigned char>(text[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);
    }
    if (ok && len == 4) {
      auto c1 = static_cast<unsigned char>(text[i + 1]);
      ok = !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
    }
    if (ok) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      escape(c);
      ++i;
    }
  }
  return out;
}

Error::Error(ErrorCode code, std::string message) : code_(code), message_(printable_text(message)) { rebuild_what(); }

Error& Error::add_context(std::string item) {
  context_.insert(context_.begin(), printable_text(item));
  rebuild_what();
  return *this;
}

Error& Error::note_place(const Place& place) {
  if (place_.file.empty()) place_.file = place.file;
  if (place_.rank < 0) place_.rank = place.rank;
  if (place_.tensor.empty()) place_.tensor = place.tensor;
  return *this;
}

namespace {

// True when `inner` names the same place as `outer` or a part of it:
// "f.distcp[0:+9][64:+5]" refines "f.distcp[0:+9]", "f.pt: cannot open" names "f.pt".
bool refines(const std::string& inner, const std::string& outer) {
  if (outer.empty() || inner.compare(0, outer.size(), outer) != 0) return false;
  if (inner.size() == outer.size()) return true;
  char next = inner[outer.size()];
  return next == '[' || next == ':' || next == ' ' || next == '/';
}

}  // namespace

// Layers add the place they know as the error passes (file, record, byte
// range, key), and a message may itself start with its file: each place is
// printed once, at its most precise, so an item that a later (inner) item
// or the message refines is left out.
void Error::rebuild_what() {
  what_.clear();
  for (std::size_t i = 0; i < context_.size(); ++i) {
    bool refined = refines(message_, context_[i]);
    for (std::size_t j = i + 1; j < context_.size() && !refined; ++j) refined = refines(context_[j], context_[i]);
    if (refined) continue;
    what_ += context_[i];
    what_ += ": ";
  }
  what_ += message_;
}

void fail(ErrorCode code, std::string message) { throw Error(code, std::move(message)); }

}  // namespace ckpt
