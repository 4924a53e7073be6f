// libFuzzer target for core/linear_regex, the engine behind --keys and every
// pattern the readers match names against. The input is a pattern, a NUL
// byte, then a subject (no NUL: the pattern is searched in itself). Compiling
// must succeed or refuse with InvalidArgument; matching, with and without
// kIcase, must agree with itself: search and match answer the same with and
// without captures (or the forms with captures refuse a pattern with too
// many groups), a whole match is also found by search and spans the
// subject, and every group lies inside the subject. Nothing may recurse per
// byte of the subject or of the pattern (std::regex did: a long key or a
// deeply nested pattern overflowed the stack).
// Seeds: tools/fuzz/seeds/linear_regex_fuzz (the patterns src/ uses and
// --keys examples, each with a subject).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/linear_regex.h"

namespace {

void check_groups(const ckpt::RegexMatch& m, const ckpt::LinearRegex& re, const std::string& subject) {
  if (m.size() != re.groups() + 1 || !m.matched(0)) std::abort();
  for (std::size_t i = 0; i < m.size(); ++i)
    if (m.matched(i) && (m.position(i) > subject.size() || m.length(i) > subject.size() - m.position(i))) std::abort();
}

void check(const ckpt::LinearRegex& re, const std::string& subject) {
  ckpt::RegexMatch found, whole;
  const bool searched = re.search(subject);
  const bool matched = re.match(subject);
  if (matched && !searched) std::abort();
  try {
    if (re.search(subject, found) != searched) std::abort();
  } catch (const ckpt::Error& e) {  // too many groups to report: the boolean forms answered
    if (e.code() != ckpt::ErrorCode::kResourceExhausted) std::abort();
    return;
  }
  if (searched) check_groups(found, re, subject);
  if (re.match(subject, whole) != matched) std::abort();
  if (matched) {
    check_groups(whole, re, subject);
    if (whole.position(0) != 0 || whole.length(0) != subject.size()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string pattern = input.substr(0, nul);
  const std::string subject = nul == std::string::npos ? pattern : input.substr(nul + 1);
  for (unsigned flags : {0u, ckpt::LinearRegex::kIcase}) {
    std::optional<ckpt::LinearRegex> re;
    try {
      re = ckpt::LinearRegex::compile(pattern, flags);
    } catch (const ckpt::Error& e) {
      if (e.code() != ckpt::ErrorCode::kInvalidArgument) std::abort();
      return 0;
    }
    check(*re, subject);
  }
  return 0;
}
