// The one verdict every fuzz target gives a parser's failure on hostile
// bytes: a ckpt::Error that blames the input (exit 2-4) is the expected
// refusal. An Internal error (exit 5, "a bug in ckptconv": a broken
// invariant) is a finding: abort, so that libFuzzer keeps the input.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace ckpt::fuzz {

inline void refused(const ckpt::Error& e) {
  if (e.code() != ckpt::ErrorCode::kInternal) return;
  std::fprintf(stderr, "fuzz: an internal error on this input: %s\n", e.what());
  std::abort();
}

}  // namespace ckpt::fuzz
