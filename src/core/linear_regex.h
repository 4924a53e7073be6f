// Regular expressions whose matching time is linear in the subject and whose
// stack use does not grow with it (a Pike VM: a Thompson NFA simulation
// carrying capture positions, as RE2 runs). libstdc++'s regex engine recurses
// once per character of the subject, so a long key (a checkpoint's, or a
// 100,000-character path under --keys) overflows the stack; nothing here
// recurses per character, and compiling recurses only per level of
// parentheses, which is bounded.
//
// The syntax is the ECMAScript subset users write: literals and escapes
// (\n \t \r \f \v \0 \xHH \cX, any other escaped character is itself), `.`
// (any byte but \n and \r), classes [...] and [^...] with ranges, \d \w \s
// \D \W \S (also inside classes) and [:alpha:]-style names inside them,
// anchors ^ $ (start and end of the subject), \b \B, groups (...) and
// (?:...), lookahead (?=...) and (?!...), alternation |, quantifiers * + ?
// {m} {m,} {m,n} and their lazy forms (*? ...). Matching is on bytes
// (ASCII classes, ASCII case folding for kIcase) and follows backtracking's
// leftmost, first-alternative-first order: whether a pattern matches is what
// the standard library's ECMAScript regex answers, and so are the captures,
// except where a repeated group can match the empty string (there an empty
// last iteration may or may not be counted) and inside a lookahead (its
// groups capture nothing). Backreferences, lookbehind, named groups and
// inline flags are refused.
//
// compile() throws ckpt::Error (kInvalidArgument) with a message naming what
// is wrong and its offset in the pattern, e.g. "unmatched '(' at offset 3".
// It also refuses patterns whose program would be too large (counted
// repetitions are expanded: a count is at most kMaxRepeat, the program at
// most kMaxInstructions), whose parentheses nest deeper than kMaxNesting
// or which hold more than kMaxLookaheads lookaheads.
// Searching a subject of n bytes costs O(n x program size) time and
// O(program size) memory; each lookahead adds n bits and one pass over the
// subject. The forms that report groups also keep the groups' positions for
// each live thread: they throw ckpt::Error (kResourceExhausted) when program
// size x groups exceeds kMaxCaptureCells, which the boolean forms never do.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt {

// The groups of one match: group 0 is the whole match, 1.. the capturing
// groups in the order of their '('. Views point into the subject searched:
// it must outlive them.
class RegexMatch {
 public:
  // Number of groups, group 0 included (0 before a successful match).
  std::size_t size() const { return spans_.size() / 2; }
  // Whether group i took part in the match.
  bool matched(std::size_t i) const { return i < size() && spans_[2 * i] >= 0; }
  // The text of group i; empty when it did not take part.
  std::string_view operator[](std::size_t i) const;
  std::string str(std::size_t i) const { return std::string((*this)[i]); }
  // Offset of group i in the subject; std::string_view::npos when it did not take part.
  std::size_t position(std::size_t i) const;
  std::size_t length(std::size_t i) const { return (*this)[i].size(); }

 private:
  friend class LinearRegex;
  std::string_view subject_;
  std::vector<std::ptrdiff_t> spans_;  // begin, end per group; -1 when unset
};

class LinearRegex {
 public:
  static constexpr unsigned kIcase = 1;  // ASCII letters match either case
  static constexpr std::size_t kMaxRepeat = 1000;
  static constexpr std::size_t kMaxInstructions = 100000;
  static constexpr std::size_t kMaxNesting = 200;
  static constexpr std::size_t kMaxLookaheads = 64;
  static constexpr std::size_t kMaxCaptureCells = std::size_t{1} << 22;

  static LinearRegex compile(std::string_view pattern, unsigned flags = 0);

  // Whether the pattern matches somewhere in subject (as regex_search).
  bool search(std::string_view subject) const;
  // The leftmost match and its groups.
  bool search(std::string_view subject, RegexMatch& match) const;
  // Whether the pattern matches all of subject (as regex_match).
  bool match(std::string_view subject) const;
  bool match(std::string_view subject, RegexMatch& match) const;
  // A match's views would outlive a temporary subject (the standard regex_search refuses it too).
  bool search(const std::string&& subject, RegexMatch& match) const = delete;
  bool match(const std::string&& subject, RegexMatch& match) const = delete;
  bool search(const char* subject, RegexMatch& m) const { return search(std::string_view(subject), m); }
  bool match(const char* subject, RegexMatch& m) const { return match(std::string_view(subject), m); }

  // Number of capturing groups (group 0 not counted).
  std::size_t groups() const;
  const std::string& pattern() const;

  struct Program;

 private:
  explicit LinearRegex(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  bool run(std::string_view subject, bool whole, RegexMatch* match) const;
  std::shared_ptr<const Program> program_;
};

}  // namespace ckpt
