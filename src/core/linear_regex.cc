#include "core/linear_regex.h"

#include <algorithm>
#include <bitset>
#include <cctype>
#include <cstdint>
#include <utility>

#include "core/error.h"

namespace ckpt {
namespace {

using ByteSet = std::bitset<256>;

enum class Op : uint8_t { kChar, kClass, kSplit, kJmp, kSave, kAssert, kMatch };
enum class Assert : uint8_t { kBegin, kEnd, kWordBoundary, kNotWordBoundary, kLookahead, kNegLookahead };

// One instruction. kChar: byte a or b (b: its other case under kIcase, else
// a). kClass: classes[x]. kSplit: x first, then y. kJmp: x. kSave: capture
// slot x. kAssert: kind a, lookahead x.
struct Inst {
  Op op;
  uint8_t a = 0;
  uint8_t b = 0;
  int x = 0;
  int y = 0;
};

bool is_word(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}
unsigned char lower(unsigned char c) { return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c; }
unsigned char upper(unsigned char c) { return c >= 'a' && c <= 'z' ? c - ('a' - 'A') : c; }

ByteSet range_set(unsigned char lo, unsigned char hi) {
  ByteSet s;
  for (int c = lo; c <= hi; ++c) s.set(c);
  return s;
}
ByteSet digit_set() { return range_set('0', '9'); }
ByteSet word_set() { return range_set('0', '9') | range_set('A', 'Z') | range_set('a', 'z') | range_set('_', '_'); }
// std::isspace in the C locale: space, \t \n \v \f \r.
ByteSet space_set() { return range_set(' ', ' ') | range_set('\t', '\r'); }

// [:name:] inside a bracket expression, as the standard library's regex knows them (C locale).
bool named_set(std::string_view name, ByteSet& out) {
  if (name == "alnum")
    out = range_set('0', '9') | range_set('A', 'Z') | range_set('a', 'z');
  else if (name == "alpha")
    out = range_set('A', 'Z') | range_set('a', 'z');
  else if (name == "blank")
    out = range_set(' ', ' ') | range_set('\t', '\t');
  else if (name == "cntrl")
    out = range_set(0, 31) | range_set(127, 127);
  else if (name == "digit" || name == "d")
    out = digit_set();
  else if (name == "graph")
    out = range_set(33, 126);
  else if (name == "lower")
    out = range_set('a', 'z');
  else if (name == "print")
    out = range_set(32, 126);
  else if (name == "punct")
    out = range_set(33, 126) & ~(range_set('0', '9') | range_set('A', 'Z') | range_set('a', 'z'));
  else if (name == "space" || name == "s")
    out = space_set();
  else if (name == "upper")
    out = range_set('A', 'Z');
  else if (name == "xdigit")
    out = range_set('0', '9') | range_set('A', 'F') | range_set('a', 'f');
  else if (name == "w")
    out = word_set();
  else
    return false;
  return true;
}

// The pattern's syntax tree. Concatenation and alternation are n-ary, so the
// tree is as deep as the pattern's parentheses nest (times a constant).
struct Node {
  enum Kind { kEmpty, kByte, kSet, kAssert, kGroup, kConcat, kAlt, kRepeat };
  explicit Node(Kind k) : kind(k) {}
  Kind kind;
  int value = 0;  // kByte: the byte; kSet: the class; kAssert: an Assert; kGroup: capture index or -1
  int look = -1;  // kAssert of a lookahead: its body
  int min = 0;    // kRepeat
  int max = 0;    // kRepeat; -1 unbounded
  bool greedy = true;
  std::vector<std::unique_ptr<Node>> kids;
};
using NodePtr = std::unique_ptr<Node>;

}  // namespace

struct LinearRegex::Program {
  std::string pattern;
  std::size_t groups = 0;
  std::vector<ByteSet> classes;
  std::vector<Inst> main;
  // Lookahead bodies, each compiled reversed (run from the subject's end to
  // find every position where the body matches); inner ones come first.
  std::vector<std::vector<Inst>> looks;
};

namespace {

class Parser {
 public:
  Parser(std::string_view pattern, bool icase, LinearRegex::Program& program)
      : p_(pattern), icase_(icase), program_(program) {}

  NodePtr parse() {
    NodePtr root = alternation(0);
    if (pos_ < p_.size()) fail_at("unmatched ')'", pos_);  // alternation stops only at ')' or the end
    return root;
  }

  std::vector<NodePtr>& look_bodies() { return looks_; }

 private:
  [[noreturn]] void fail_at(const std::string& what, std::size_t at) {
    fail_invalid(what + " at offset " + std::to_string(at));
  }
  bool more() const { return pos_ < p_.size(); }
  char peek() const { return p_[pos_]; }

  NodePtr make(Node::Kind kind, int value = 0) {
    auto n = std::make_unique<Node>(kind);
    n->value = value;
    return n;
  }
  NodePtr set_node(ByteSet set, bool negate) {
    if (icase_) {
      ByteSet folded = set;
      for (int c = 0; c < 256; ++c)
        if (set[lower(static_cast<unsigned char>(c))] || set[upper(static_cast<unsigned char>(c))]) folded.set(c);
      set = folded;
    }
    if (negate) set.flip();
    program_.classes.push_back(set);
    return make(Node::kSet, static_cast<int>(program_.classes.size() - 1));
  }

  NodePtr alternation(std::size_t depth) {
    NodePtr first = concat(depth);
    if (!more() || peek() != '|') return first;
    NodePtr alt = make(Node::kAlt);
    alt->kids.push_back(std::move(first));
    while (more() && peek() == '|') {
      ++pos_;
      alt->kids.push_back(concat(depth));
    }
    return alt;
  }

  NodePtr concat(std::size_t depth) {
    NodePtr cat = make(Node::kConcat);
    while (more() && peek() != '|' && peek() != ')') cat->kids.push_back(quantified(depth));
    if (cat->kids.empty()) return make(Node::kEmpty);
    if (cat->kids.size() == 1) return std::move(cat->kids[0]);
    return cat;
  }

  static bool is_quantifier(char c) { return c == '*' || c == '+' || c == '?' || c == '{'; }

  NodePtr quantified(std::size_t depth) {
    if (is_quantifier(peek())) fail_at("nothing to repeat", pos_);
    bool assertion = false;
    NodePtr atom = this->atom(depth, assertion);
    if (!more() || !is_quantifier(peek())) return atom;
    std::size_t at = pos_;
    int min = 0, max = -1;
    char c = p_[pos_++];
    if (c == '+') {
      min = 1;
    } else if (c == '?') {
      max = 1;
    } else if (c == '{') {
      braces(at, min, max);
    }
    if (assertion) fail_at("nothing to repeat (an assertion cannot be repeated)", at);
    auto rep = make(Node::kRepeat);
    rep->min = min;
    rep->max = max;
    if (more() && peek() == '?') {
      rep->greedy = false;
      ++pos_;
    }
    if (more() && is_quantifier(peek())) fail_at("nothing to repeat", pos_);
    rep->kids.push_back(std::move(atom));
    return rep;
  }

  // {m} {m,} {m,n}, after the '{' at `at`.
  void braces(std::size_t at, int& min, int& max) {
    auto number = [&]() {
      std::size_t start = pos_;
      std::size_t value = 0;
      while (more() && peek() >= '0' && peek() <= '9') {
        value = value * 10 + static_cast<std::size_t>(peek() - '0');
        if (value > LinearRegex::kMaxRepeat)
          fail_at("repetition count above " + std::to_string(LinearRegex::kMaxRepeat), at);
        ++pos_;
      }
      if (pos_ == start) fail_at("invalid repetition braces (expected {m}, {m,} or {m,n})", at);
      return static_cast<int>(value);
    };
    min = number();
    max = min;
    if (more() && peek() == ',') {
      ++pos_;
      max = more() && peek() == '}' ? -1 : number();
    }
    if (!more() || peek() != '}') fail_at("invalid repetition braces (expected {m}, {m,} or {m,n})", at);
    ++pos_;
    if (max >= 0 && max < min) fail_at("repetition {m,n} with n below m", at);
  }

  NodePtr atom(std::size_t depth, bool& assertion) {
    std::size_t at = pos_;
    char c = p_[pos_++];
    switch (c) {
      case '.': {
        ByteSet dot;
        dot.set();
        dot.reset('\n');
        dot.reset('\r');
        program_.classes.push_back(dot);
        return make(Node::kSet, static_cast<int>(program_.classes.size() - 1));
      }
      case '^': assertion = true; return make(Node::kAssert, static_cast<int>(Assert::kBegin));
      case '$': assertion = true; return make(Node::kAssert, static_cast<int>(Assert::kEnd));
      case '[': return bracket(at);
      case '(': return group(depth, at, assertion);
      case '\\': return escape(at, assertion);
      default: return make(Node::kByte, static_cast<unsigned char>(c));
    }
  }

  NodePtr group(std::size_t depth, std::size_t at, bool& assertion) {
    if (depth + 1 > LinearRegex::kMaxNesting)
      fail_at("parentheses nested deeper than " + std::to_string(LinearRegex::kMaxNesting), at);
    int capture = -1;
    int look = 0;  // 1 (?=, 2 (?!
    if (more() && peek() == '?') {
      ++pos_;
      char kind = more() ? peek() : '\0';
      if (kind == ':') {
        ++pos_;
      } else if (kind == '=' || kind == '!') {
        look = kind == '=' ? 1 : 2;
        ++pos_;
      } else if (kind == '<' && pos_ + 1 < p_.size() && (p_[pos_ + 1] == '=' || p_[pos_ + 1] == '!')) {
        fail_at("lookbehind (?<= (?<! is not supported", at);
      } else if (kind == '<') {
        fail_at("named groups (?<name> are not supported", at);
      } else {
        fail_at("unsupported group syntax (?" + std::string(more() ? 1 : 0, kind), at);
      }
    } else {
      capture = static_cast<int>(++program_.groups);
    }
    NodePtr body = alternation(depth + 1);
    if (!more() || peek() != ')') fail_at("unmatched '('", at);
    ++pos_;
    if (look) {
      if (looks_.size() >= LinearRegex::kMaxLookaheads)
        fail_at("more than " + std::to_string(LinearRegex::kMaxLookaheads) + " lookaheads", at);
      assertion = true;
      looks_.push_back(std::move(body));
      auto n = make(Node::kAssert, static_cast<int>(look == 1 ? Assert::kLookahead : Assert::kNegLookahead));
      n->look = static_cast<int>(looks_.size() - 1);
      return n;
    }
    auto n = make(Node::kGroup, capture);
    n->kids.push_back(std::move(body));
    return n;
  }

  // The byte an escape names (after its backslash at `at`, its letter read).
  unsigned char escaped_byte(char e, std::size_t at) {
    auto hex = [&](int digits) {
      int value = 0;
      for (int i = 0; i < digits; ++i) {
        if (!more() || !std::isxdigit(static_cast<unsigned char>(peek())))
          fail_at(std::string("\\") + e + " needs " + std::to_string(digits) + " hexadecimal digits", at);
        char h = p_[pos_++];
        value = value * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      return value;
    };
    switch (e) {
      case '0': return 0;
      case 'f': return '\f';
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'v': return '\v';
      case 'x': return static_cast<unsigned char>(hex(2));
      case 'u': {
        int value = hex(4);
        if (value > 0xff) fail_at("\\u above \\u00FF (patterns match bytes)", at);
        return static_cast<unsigned char>(value);
      }
      case 'c': {
        if (!more() || !std::isalpha(static_cast<unsigned char>(peek()))) fail_at("\\c needs a letter", at);
        return static_cast<unsigned char>(p_[pos_++] % 32);
      }
      default:
        if (e >= '1' && e <= '9') fail_at("backreferences are not supported", at);
        return static_cast<unsigned char>(e);  // an identity escape: \. \\ \( ...
    }
  }

  static bool class_escape(char e, ByteSet& out) {
    switch (e) {
      case 'd': out = digit_set(); return true;
      case 'D': out = ~digit_set(); return true;
      case 'w': out = word_set(); return true;
      case 'W': out = ~word_set(); return true;
      case 's': out = space_set(); return true;
      case 'S': out = ~space_set(); return true;
      default: return false;
    }
  }

  NodePtr escape(std::size_t at, bool& assertion) {
    if (!more()) fail_at("trailing backslash", at);
    char e = p_[pos_++];
    ByteSet set;
    if (class_escape(e, set)) return set_node(set, false);
    if (e == 'b' || e == 'B') {
      assertion = true;
      return make(Node::kAssert, static_cast<int>(e == 'b' ? Assert::kWordBoundary : Assert::kNotWordBoundary));
    }
    return make(Node::kByte, escaped_byte(e, at));
  }

  // One member of a bracket expression: a byte, or a set (\d, [:alpha:]).
  struct Member {
    bool is_set = false;
    unsigned char byte = 0;
    ByteSet set;
  };

  Member member(std::size_t open) {
    Member m;
    std::size_t at = pos_;
    char c = p_[pos_++];
    if (c == '\\') {
      if (!more()) fail_at("unterminated character class '['", open);
      char e = p_[pos_++];
      if (class_escape(e, m.set)) {
        m.is_set = true;
      } else if (e == 'b') {
        m.byte = '\b';
      } else if (e == 'B') {
        fail_at("\\B inside a character class", at);
      } else {
        m.byte = escaped_byte(e, at);
      }
    } else if (c == '[' && more() && (peek() == ':' || peek() == '=' || peek() == '.')) {
      char kind = peek();
      std::size_t close = p_.find(std::string{kind, ']'}, pos_ + 1);
      if (close == std::string_view::npos)
        fail_at("unterminated [" + std::string(1, kind) + " in a character class", at);
      std::string_view name = p_.substr(pos_ + 1, close - pos_ - 1);
      if (kind != ':') fail_at("collating elements and equivalence classes ([. .] [= =]) are not supported", at);
      if (!named_set(name, m.set)) fail_at("unknown character class name [:" + std::string(name) + ":]", at);
      m.is_set = true;
      pos_ = close + 2;
    } else {
      m.byte = static_cast<unsigned char>(c);
    }
    return m;
  }

  NodePtr bracket(std::size_t open) {
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    ByteSet set;
    for (;;) {
      if (!more()) fail_at("unterminated character class '['", open);
      if (peek() == ']') {  // ECMAScript: [] matches nothing, [^] any byte
        ++pos_;
        break;
      }
      std::size_t at = pos_;
      Member lo = member(open);
      if (more() && peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        Member hi = member(open);
        if (lo.is_set || hi.is_set) fail_at("a class escape cannot bound a range in a character class", at);
        if (hi.byte < lo.byte) fail_at("invalid range in a character class (its end is below its start)", at);
        set |= range_set(lo.byte, hi.byte);
      } else if (lo.is_set) {
        set |= lo.set;
      } else {
        set.set(lo.byte);
      }
    }
    return set_node(set, negate);
  }

  std::string_view p_;
  bool icase_;
  LinearRegex::Program& program_;
  std::size_t pos_ = 0;
  std::vector<NodePtr> looks_;
};

class Compiler {
 public:
  Compiler(bool icase, std::size_t& count) : icase_(icase), count_(count) {}

  // Where emit() appends.
  void target(std::vector<Inst>& out) { out_ = &out; }
  // Emits n; reversed: a concatenation's parts in reverse order (a
  // lookahead body, run from right to left).
  void gen(const Node& n, bool reversed) { node(n, reversed); }

  int emit(Inst in) {
    if (count_ >= LinearRegex::kMaxInstructions)
      fail_invalid("the pattern is too large: more than " + std::to_string(LinearRegex::kMaxInstructions) +
                   " instructions once its counted repetitions are expanded");
    ++count_;
    out_->push_back(in);
    return static_cast<int>(out_->size() - 1);
  }
  int here() const { return static_cast<int>(out_->size()); }

 private:
  void node(const Node& n, bool reversed) {
    std::vector<Inst>& out = *out_;
    switch (n.kind) {
      case Node::kEmpty: return;
      case Node::kByte: {
        auto c = static_cast<unsigned char>(n.value);
        emit({Op::kChar, c, icase_ ? (c == lower(c) ? upper(c) : lower(c)) : c});
        return;
      }
      case Node::kSet: emit({Op::kClass, 0, 0, n.value}); return;
      case Node::kAssert: emit({Op::kAssert, static_cast<uint8_t>(n.value), 0, n.look}); return;
      case Node::kGroup:
        if (n.value >= 0 && !reversed) emit({Op::kSave, 0, 0, 2 * n.value});
        node(*n.kids[0], reversed);
        if (n.value >= 0 && !reversed) emit({Op::kSave, 0, 0, 2 * n.value + 1});
        return;
      case Node::kConcat:
        if (reversed) {
          for (auto it = n.kids.rbegin(); it != n.kids.rend(); ++it) node(**it, reversed);
        } else {
          for (const auto& k : n.kids) node(*k, reversed);
        }
        return;
      case Node::kAlt: {
        std::vector<int> jumps;
        for (std::size_t i = 0; i + 1 < n.kids.size(); ++i) {
          int split = emit({Op::kSplit});
          out[split].x = here();
          node(*n.kids[i], reversed);
          jumps.push_back(emit({Op::kJmp}));
          out[split].y = here();
        }
        node(*n.kids.back(), reversed);
        for (int j : jumps) out[j].x = here();
        return;
      }
      case Node::kRepeat: repeat(n, reversed); return;
    }
  }

  // Prefers the body (greedy) or what follows (lazy).
  void set_split(int split, int body, int next, bool greedy) {
    (*out_)[split].x = greedy ? body : next;
    (*out_)[split].y = greedy ? next : body;
  }

  void repeat(const Node& n, bool reversed) {
    const Node& body = *n.kids[0];
    if (n.max < 0) {
      // x{m,}: m-1 copies, then x once more looping back (x*: a loop around x).
      for (int i = 0; i + 1 < n.min; ++i) node(body, reversed);
      if (n.min == 0) {
        int split = emit({Op::kSplit});
        node(body, reversed);
        emit({Op::kJmp, 0, 0, split});
        set_split(split, split + 1, here(), n.greedy);
      } else {
        int start = here();
        node(body, reversed);
        int split = emit({Op::kSplit});
        set_split(split, start, here(), n.greedy);
      }
      return;
    }
    for (int i = 0; i < n.min; ++i) node(body, reversed);
    // x{m,n}: then n-m optional copies, each skipping to the end.
    std::vector<int> splits;
    for (int i = n.min; i < n.max; ++i) {
      splits.push_back(emit({Op::kSplit}));
      node(body, reversed);
    }
    for (int s : splits) set_split(s, s + 1, here(), n.greedy);
  }

  bool icase_;
  std::size_t& count_;
  std::vector<Inst>* out_ = nullptr;
};

// A set of program counters in priority order (a sparse set), each with its
// thread's capture slots.
struct ThreadList {
  explicit ThreadList(std::size_t size) : sparse(size), dense(size) {}
  bool contains(int pc) const {
    std::size_t i = sparse[pc];
    return i < n && dense[i] == pc;
  }
  std::size_t insert(int pc) {
    sparse[pc] = n;
    dense[n] = pc;
    return n++;
  }
  std::ptrdiff_t* caps(std::size_t i, std::size_t ncap) { return caps_.data() + i * ncap; }
  void reserve_caps(std::size_t i, std::size_t ncap) {
    if (caps_.size() < (i + 1) * ncap) caps_.resize((i + 1) * ncap);
  }

  std::vector<std::size_t> sparse;
  std::vector<int> dense;
  std::size_t n = 0;
  std::vector<std::ptrdiff_t> caps_;
};

class Runner {
 public:
  Runner(const LinearRegex::Program& program, std::string_view subject) : program_(program), s_(subject) {
    // Each lookahead's positions, inner ones first: its reversed body run
    // from the end, entered at every position; where it reaches its match
    // the body matches a stretch starting there.
    for (const auto& body : program_.looks) {
      std::vector<bool> bits(s_.size() + 1, false);
      ThreadList cur(body.size()), next(body.size());
      for (std::size_t pos = s_.size();; --pos) {
        add(cur, body, 0, pos, nullptr, 0);
        for (std::size_t i = 0; i < cur.n; ++i)
          if (body[cur.dense[i]].op == Op::kMatch) {
            bits[pos] = true;
            break;
          }
        if (pos == 0) break;
        next.n = 0;
        auto c = static_cast<unsigned char>(s_[pos - 1]);
        for (std::size_t i = 0; i < cur.n; ++i)
          if (consumes(body[cur.dense[i]], c)) add(next, body, cur.dense[i] + 1, pos - 1, nullptr, 0);
        std::swap(cur, next);
      }
      looks_.push_back(std::move(bits));
    }
  }

  bool consumes(const Inst& in, unsigned char c) const {
    if (in.op == Op::kChar) return c == in.a || c == in.b;
    return in.op == Op::kClass && program_.classes[in.x][c];
  }

  bool holds(const Inst& in, std::size_t pos) const {
    switch (static_cast<Assert>(in.a)) {
      case Assert::kBegin: return pos == 0;
      case Assert::kEnd: return pos == s_.size();
      case Assert::kWordBoundary:
      case Assert::kNotWordBoundary: {
        bool before = pos > 0 && is_word(static_cast<unsigned char>(s_[pos - 1]));
        bool after = pos < s_.size() && is_word(static_cast<unsigned char>(s_[pos]));
        return (before != after) == (static_cast<Assert>(in.a) == Assert::kWordBoundary);
      }
      case Assert::kLookahead: return looks_[in.x][pos];
      case Assert::kNegLookahead: return !looks_[in.x][pos];
    }
    return false;
  }

  // Adds the thread at pc, and every thread its jumps, splits, saves and
  // assertions lead to at pos, to list in priority order (a depth-first
  // walk on an explicit stack; each pc once). cap: the thread's capture
  // slots, restored on return.
  void add(ThreadList& list, const std::vector<Inst>& prog, int pc0, std::size_t pos, std::ptrdiff_t* cap,
           std::size_t ncap) {
    stack_.clear();
    stack_.push_back({pc0, -1, 0});
    while (!stack_.empty()) {
      Frame f = stack_.back();
      stack_.pop_back();
      if (f.slot >= 0) {
        cap[f.slot] = f.old;
        continue;
      }
      int pc = f.pc;
      for (;;) {
        if (list.contains(pc)) break;
        std::size_t i = list.insert(pc);
        const Inst& in = prog[pc];
        if (in.op == Op::kJmp) {
          pc = in.x;
        } else if (in.op == Op::kSplit) {
          stack_.push_back({in.y, -1, 0});
          pc = in.x;
        } else if (in.op == Op::kSave) {
          if (static_cast<std::size_t>(in.x) < ncap) {
            stack_.push_back({0, in.x, cap[in.x]});
            cap[in.x] = static_cast<std::ptrdiff_t>(pos);
          }
          ++pc;
        } else if (in.op == Op::kAssert) {
          if (!holds(in, pos)) break;
          ++pc;
        } else {  // a byte to consume, or the match: the thread waits here
          if (ncap) {
            list.reserve_caps(i, ncap);
            std::copy(cap, cap + ncap, list.caps(i, ncap));
          }
          break;
        }
      }
    }
  }

 private:
  struct Frame {
    int pc;
    int slot;  // >= 0: restore cap[slot] = old
    std::ptrdiff_t old;
  };
  const LinearRegex::Program& program_;
  std::string_view s_;
  std::vector<std::vector<bool>> looks_;
  std::vector<Frame> stack_;
};

}  // namespace

std::string_view RegexMatch::operator[](std::size_t i) const {
  if (!matched(i)) return {};
  return subject_.substr(static_cast<std::size_t>(spans_[2 * i]),
                         static_cast<std::size_t>(spans_[2 * i + 1] - spans_[2 * i]));
}

std::size_t RegexMatch::position(std::size_t i) const {
  return matched(i) ? static_cast<std::size_t>(spans_[2 * i]) : std::string_view::npos;
}

LinearRegex LinearRegex::compile(std::string_view pattern, unsigned flags) {
  auto program = std::make_shared<Program>();
  program->pattern = std::string(pattern);
  bool icase = (flags & kIcase) != 0;
  Parser parser(pattern, icase, *program);
  NodePtr root = parser.parse();
  std::size_t count = 0;
  Compiler compiler(icase, count);
  program->looks.resize(parser.look_bodies().size());
  for (std::size_t i = 0; i < program->looks.size(); ++i) {
    compiler.target(program->looks[i]);
    compiler.gen(*parser.look_bodies()[i], true);
    compiler.emit({Op::kMatch});
  }
  compiler.target(program->main);
  compiler.emit({Op::kSave, 0, 0, 0});
  compiler.gen(*root, false);
  compiler.emit({Op::kSave, 0, 0, 1});
  compiler.emit({Op::kMatch});
  return LinearRegex(std::move(program));
}

std::size_t LinearRegex::groups() const { return program_->groups; }
const std::string& LinearRegex::pattern() const { return program_->pattern; }

bool LinearRegex::search(std::string_view subject) const { return run(subject, false, nullptr); }
bool LinearRegex::search(std::string_view subject, RegexMatch& match) const { return run(subject, false, &match); }
bool LinearRegex::match(std::string_view subject) const { return run(subject, true, nullptr); }
bool LinearRegex::match(std::string_view subject, RegexMatch& match) const { return run(subject, true, &match); }

// The Pike VM: every thread advances over each byte in step, in priority
// order; the first thread (in that order) to reach the match wins and cuts
// off those after it, which gives backtracking's leftmost, first-alternative
// match and captures. whole: entered at 0 only and matching only at the end.
bool LinearRegex::run(std::string_view subject, bool whole, RegexMatch* match) const {
  const Program& p = *program_;
  const std::vector<Inst>& prog = p.main;
  Runner runner(p, subject);
  const std::size_t ncap = match ? 2 * (p.groups + 1) : 0;
  if (ncap && prog.size() * ncap > kMaxCaptureCells)
    fail(ErrorCode::kResourceExhausted, "regular expression '" + p.pattern + "': " + std::to_string(p.groups) +
                                            " groups in a program of " + std::to_string(prog.size()) +
                                            " instructions are too many to report the groups of a match");
  ThreadList cur(prog.size()), next(prog.size());
  std::vector<std::ptrdiff_t> cap(ncap, -1), best;
  bool matched = false;
  const std::size_t n = subject.size();
  for (std::size_t pos = 0;; ++pos) {
    if (!matched && (pos == 0 || !whole)) {
      std::fill(cap.begin(), cap.end(), -1);
      runner.add(cur, prog, 0, pos, cap.data(), ncap);
    }
    if (cur.n == 0 && (matched || whole)) break;
    next.n = 0;
    for (std::size_t i = 0; i < cur.n; ++i) {
      const int pc = cur.dense[i];
      const Inst& in = prog[pc];
      if (in.op == Op::kMatch) {
        if (whole && pos != n) continue;
        if (!match) return true;
        matched = true;
        best.assign(cur.caps(i, ncap), cur.caps(i, ncap) + ncap);
        break;  // the threads after this one have lower priority
      }
      if (pos < n && runner.consumes(in, static_cast<unsigned char>(subject[pos]))) {
        if (ncap) std::copy(cur.caps(i, ncap), cur.caps(i, ncap) + ncap, cap.begin());
        runner.add(next, prog, pc + 1, pos + 1, cap.data(), ncap);
      }
    }
    if (pos == n) break;
    std::swap(cur, next);
  }
  if (match) {
    match->subject_ = subject;
    match->spans_ = matched ? best : std::vector<std::ptrdiff_t>{};
  }
  return matched;
}

}  // namespace ckpt
