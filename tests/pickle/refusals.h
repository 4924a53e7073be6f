// What the checkpoint policy says of a pickle, for the policy's tests: the
// Unsafe message it refuses it with, "accepted", or "not Unsafe: ..." when
// it fails another way.
#pragma once

#include <string>

#include "core/error.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"

namespace refusals {

inline std::string refusal(const std::string& bytes) {
  try {
    ckpt::pickle::unpickle(bytes, ckpt::pickle::checkpoint_policy());
  } catch (const ckpt::Error& e) {
    if (e.code() != ckpt::ErrorCode::kUnsafe) return "not Unsafe: " + std::string(e.what());
    return e.message();
  }
  return "accepted";
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace refusals
