#include "plan/arch_map.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/linear_regex.h"
#include "model/ordered_json.h"
#include "model/tree_walk.h"
#include "model/validate.h"

namespace ckpt {

// Defined in the file CMake generates from maps/*.json (name, text).
const std::vector<std::pair<std::string, std::string>>& builtin_arch_map_texts();

namespace {

// Rounds towards +infinity for any sign of `a` (b > 0).
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// ---- expressions: config fields, integers, + - * / and parentheses ----

class Expression {
 public:
  Expression(const std::string& text, const ArchMap& map, const ConfigFields& config, const std::string& config_name,
             std::vector<std::string>& stack)
      : text_(text), map_(map), config_(config), config_name_(config_name), stack_(stack) {}

  int64_t value() {
    int64_t v = sum();
    skip_space();
    if (pos_ != text_.size()) bad("unexpected '" + text_.substr(pos_, 1) + "'");
    return v;
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    fail_invalid("map " + map_.name + " (" + map_.origin + "): expression '" + text_ + "': " + why);
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) return ++pos_, true;
    return false;
  }
  // Config values come from a file: an overflow is refused, never wrapped.
  void overflow() const {
    fail(ErrorCode::kDataLoss, config_name_ + ": '" + text_ + "' overflows for map " + map_.name);
  }
  int64_t sum() {
    int64_t v = product();
    for (;;) {
      if (eat('+')) {
        if (__builtin_add_overflow(v, product(), &v)) overflow();
      } else if (eat('-')) {
        if (__builtin_sub_overflow(v, product(), &v)) overflow();
      } else {
        return v;
      }
    }
  }
  int64_t product() {
    int64_t v = atom();
    for (;;) {
      if (eat('*')) {
        if (__builtin_mul_overflow(v, atom(), &v)) overflow();
      } else if (eat('/')) {
        int64_t d = atom();
        // Sizes divide exactly or the config is not what the map expects.
        if (d == 0 || v % d != 0)
          fail(ErrorCode::kDataLoss, config_name_ + ": '" + text_ + "' does not divide exactly (" + std::to_string(v) +
                                         " / " + std::to_string(d) + ") for map " + map_.name);
        v /= d;
      } else {
        return v;
      }
    }
  }
  int64_t atom() {
    skip_space();
    if (eat('(')) {
      int64_t v = sum();
      if (!eat(')')) bad("missing ')'");
      return v;
    }
    std::size_t start = pos_;
    if (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      if (pos_ - start > 18) bad("a number of more than 18 digits");
      return std::stoll(text_.substr(start, pos_ - start));
    }
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    if (start == pos_) bad(pos_ < text_.size() ? "unexpected '" + text_.substr(pos_, 1) + "'" : "incomplete");
    return field(text_.substr(start, pos_ - start));
  }
  int64_t field(const std::string& name) {
    if (auto it = config_.find(name); it != config_.end()) return it->second;
    auto d = map_.defaults.find(name);
    if (d == map_.defaults.end())
      fail(ErrorCode::kNotFound, config_name_ + ": no integer field '" + name + "', which map " + map_.name + " needs");
    if (std::find(stack_.begin(), stack_.end(), name) != stack_.end()) bad("default '" + name + "' refers to itself");
    stack_.push_back(name);
    int64_t v = Expression(d->second, map_, config_, config_name_, stack_).value();
    stack_.pop_back();
    return v;
  }

  const std::string& text_;
  const ArchMap& map_;
  const ConfigFields& config_;
  const std::string& config_name_;
  std::vector<std::string>& stack_;
  std::size_t pos_ = 0;
};

struct Evaluator {
  const ArchMap& map;
  const ConfigFields& config;
  const std::string& config_name;
  int64_t operator()(const std::string& text) const {
    std::vector<std::string> stack;
    return Expression(text, map, config, config_name, stack).value();
  }
};

// ---- name patterns ----

// A pattern's placeholders ({L}) in order, and its regex: literal text
// escaped, each placeholder a decimal index, '*' (skip patterns) anything.
// LinearRegex, not the standard library's backtracking matcher: the names
// matched are the checkpoint's, and that matcher recurses once per byte.
struct Pattern {
  LinearRegex re;
  std::vector<std::string> names;
};

Pattern compile_pattern(const std::string& text, const std::string& where) {
  std::vector<std::string> names;
  std::string re;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '{') {
      std::size_t end = text.find('}', i);
      if (end == std::string::npos || end == i + 1) fail_invalid(where + ": unclosed or empty '{' in '" + text + "'");
      names.push_back(text.substr(i + 1, end - i - 1));
      re += "(0|[1-9][0-9]*)";
      i = end;
    } else if (c == '*') {
      re += ".*";
    } else {
      if (std::strchr(".^$|()[]{}+?\\", c)) re += '\\';
      re += c;
    }
  }
  return Pattern{LinearRegex::compile(re), std::move(names)};
}

std::string substitute(const std::string& pattern, const std::map<std::string, std::string>& values) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '{') {
      std::size_t end = pattern.find('}', i);
      out += values.at(pattern.substr(i + 1, end - i - 1));
      i = end;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// ---- parsing ----

const nlohmann::ordered_json& member(const JsonMembers& m, const std::string& key, const std::string& where) {
  const auto* v = m.find(key);
  if (!v) fail_invalid(where + ": missing \"" + key + "\"");
  return *v;
}

std::string as_string(const nlohmann::ordered_json& v, const std::string& where) {
  if (!v.is_string()) fail_invalid(where + ": expected a string, got " + v.dump());
  return v.get<std::string>();
}

// An expression: a string, or an integer written as a number.
std::string as_expression(const nlohmann::ordered_json& v, const std::string& where) {
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  return as_string(v, where);
}

std::vector<std::string> as_strings(const nlohmann::ordered_json& v, const std::string& where, bool expressions) {
  if (!v.is_array()) fail_invalid(where + ": expected a list, got " + v.dump());
  std::vector<std::string> out;
  for (const auto& e : v) out.push_back(expressions ? as_expression(e, where) : as_string(e, where));
  return out;
}

// "stack": an expression (the index each source takes); "unstack": the
// placeholder the targets take. The count of operations they add.
int parse_stacking(const JsonMembers& m, MapRule& r, const std::string& where) {
  int ops = 0;
  if (const auto* s = m.find("stack")) {
    ++ops;
    r.op = MapRule::Op::kStack;
    r.stack = as_expression(*s, where + ".stack");
  }
  if (const auto* u = m.find("unstack")) {
    ++ops;
    r.op = MapRule::Op::kUnstack;
    r.unstack = as_string(*u, where + ".unstack");
  }
  return ops;
}

// A stacked target is one tensor (its shape with the new leading dim); an
// unstacked one names the placeholder its slices take, which the source
// does not capture (`captured`, sorted).
void check_stacking(const MapRule& r, const std::vector<std::string>& captured, const std::string& where) {
  if (r.op == MapRule::Op::kStack && r.shapes.front().empty())
    fail_invalid(where + ": a stacked target's shape has the stacked dim first");
  if (r.tie && (r.op == MapRule::Op::kStack || r.op == MapRule::Op::kUnstack))
    fail_invalid(where + ": a tie copies one tensor to one place; it cannot stack or unstack");
  if (r.op != MapRule::Op::kUnstack) return;
  if (std::binary_search(captured.begin(), captured.end(), r.unstack))
    fail_invalid(where + ": unstack puts {" + r.unstack + "} into the targets, and '" + r.from[0] +
                 "' captures it already");
  const auto in_target = compile_pattern(r.to.front(), where + ".to").names;
  if (std::find(in_target.begin(), in_target.end(), r.unstack) == in_target.end())
    fail_invalid(where + ": unstack's target '" + r.to.front() + "' does not use {" + r.unstack + "}");
}

MapRule parse_rule(const nlohmann::ordered_json& j, const std::string& where) {
  if (!j.is_object()) fail_invalid(where + ": a rule is an object");
  JsonMembers m(j, where);
  static const std::set<std::string> kKnown = {"from",   "to",      "split", "unpad",  "permute_rope",
                                               "stack",  "unstack", "shape", "shapes", "optional",
                                               "unless", "comment", "tie"};
  for (const auto& [k, v] : j.items())
    if (!kKnown.count(k)) fail_invalid(where + ": unknown key \"" + k + "\"");
  MapRule r;
  const auto& from = member(m, "from", where);
  r.from = from.is_array() ? as_strings(from, where + ".from", false)
                           : std::vector<std::string>{as_string(from, where + ".from")};
  if (r.from.empty()) fail_invalid(where + ".from: no pattern");
  const auto& to = member(m, "to", where);
  r.to = to.is_array() ? as_strings(to, where + ".to", false) : std::vector<std::string>{as_string(to, where + ".to")};
  int ops = 0;
  if (const auto* s = m.find("split")) {
    ++ops;
    r.op = MapRule::Op::kSplit;
    if (!s->is_object()) fail_invalid(where + ".split: an object {\"groups\": ..., \"sections\": [...]}");
    JsonMembers sm(*s, where + ".split");
    r.groups = sm.find("groups") ? as_expression(*sm.find("groups"), where + ".split.groups") : "1";
    r.sections = as_strings(member(sm, "sections", where + ".split"), where + ".split.sections", true);
    if (r.sections.size() != r.to.size())
      fail_invalid(where + ": split gives " + std::to_string(r.sections.size()) + " sections to " +
                   std::to_string(r.to.size()) + " targets");
  }
  if (const auto* u = m.find("unpad")) {
    ++ops;
    r.op = MapRule::Op::kUnpad;
    r.rows = as_expression(*u, where + ".unpad");
  }
  if (const auto* p = m.find("permute_rope")) {
    ++ops;
    r.op = MapRule::Op::kPermuteRope;
    r.head_dim = as_expression(*p, where + ".permute_rope");
  }
  ops += parse_stacking(m, r, where);
  if (ops > 1) fail_invalid(where + ": one operation per rule (split, unpad, permute_rope, stack or unstack)");
  if (r.op != MapRule::Op::kSplit && r.to.size() != 1) fail_invalid(where + ": only split has several targets");
  const auto* shape = m.find("shape");
  const auto* shapes = m.find("shapes");
  if (shape && shapes) fail_invalid(where + ": \"shape\" or \"shapes\", not both");
  if (shape) r.shapes.push_back(as_strings(*shape, where + ".shape", true));
  if (shapes) {
    if (!shapes->is_array()) fail_invalid(where + ".shapes: a list of shapes, one per target");
    for (const auto& s : *shapes) r.shapes.push_back(as_strings(s, where + ".shapes", true));
  }
  if (r.shapes.size() != r.to.size())
    fail_invalid(where +
                 ": give the shape of each target (\"shape\" for one, \"shapes\" for several): the config "
                 "checks every tensor");
  if (const auto* o = m.find("optional")) {
    if (!o->is_boolean()) fail_invalid(where + ".optional: true or false");
    r.optional = o->get<bool>();
  }
  if (const auto* u = m.find("unless")) r.unless = as_expression(*u, where + ".unless");
  if (const auto* t = m.find("tie")) {
    if (!t->is_boolean()) fail_invalid(where + ".tie: true or false");
    r.tie = t->get<bool>();
  }
  // Every alternative captures the same placeholders, and every
  // placeholder of a target is captured.
  std::vector<std::string> names = compile_pattern(r.from[0], where + ".from").names;
  std::sort(names.begin(), names.end());
  for (const auto& f : r.from) {
    std::vector<std::string> these = compile_pattern(f, where + ".from").names;
    std::sort(these.begin(), these.end());
    if (these != names) fail_invalid(where + ": '" + f + "' and '" + r.from[0] + "' capture different indices");
  }
  for (const auto& t : r.to)
    for (const auto& n : compile_pattern(t, where + ".to").names)
      if (!std::binary_search(names.begin(), names.end(), n) && n != r.unstack)
        fail_invalid(where + ": target '" + t + "' uses {" + n + "}, which '" + r.from[0] + "' does not capture");
  check_stacking(r, names, where);
  return r;
}

std::vector<ArchMap> parse_builtins() {
  std::vector<ArchMap> out;
  for (const auto& [name, text] : builtin_arch_map_texts()) out.push_back(parse_arch_map(text, name, "built in"));
  return out;
}

// The tensor for one target, its rows picked by the rule's operation.
TensorEntry target_tensor(const TensorEntry& src, const MapRule& rule, std::size_t index, const std::string& name,
                          const Evaluator& eval) {
  if (src.shape.empty() && rule.op != MapRule::Op::kRename)
    fail(ErrorCode::kUnimplemented, "tensor '" + src.name + "': a 0-dim tensor has no rows to split, unpad or permute");
  const int64_t rows = src.shape.empty() ? 0 : src.shape[0];
  switch (rule.op) {
    case MapRule::Op::kRename: {
      TensorEntry t = src;
      t.name = name;
      return t;
    }
    case MapRule::Op::kUnpad: {
      int64_t keep = eval(rule.rows);
      if (keep > rows || keep <= 0)
        fail(ErrorCode::kDataLoss, "tensor '" + src.name + "' has " + std::to_string(rows) + " rows: it cannot keep " +
                                       rule.rows + " = " + std::to_string(keep) + " of " + eval.config_name);
      return gather_rows(src, {{0, keep, 1}}, name);
    }
    case MapRule::Op::kSplit: {
      const int64_t groups = eval(rule.groups);
      std::vector<int64_t> sections;
      int64_t block = 0;
      std::string fields;
      for (const auto& s : rule.sections) {
        sections.push_back(eval(s));
        block += sections.back();
        fields += (fields.empty() ? "" : " + ") + s;
      }
      if (groups <= 0 || groups * block != rows)
        fail(ErrorCode::kDataLoss, "tensor '" + src.name + "' has " + std::to_string(rows) + " rows, not " +
                                       rule.groups + " x (" + fields + ") = " + std::to_string(groups) + " x " +
                                       std::to_string(block) + " as " + eval.config_name + " gives");
      return gather_rows(src, split_runs(groups, sections, index), name);
    }
    case MapRule::Op::kPermuteRope: {
      int64_t head_dim = eval(rule.head_dim);
      if (head_dim <= 0 || head_dim % 2 != 0 || rows % head_dim != 0)
        fail(ErrorCode::kDataLoss, "tensor '" + src.name + "' has " + std::to_string(rows) +
                                       " rows, not whole heads of " + rule.head_dim + " = " + std::to_string(head_dim) +
                                       " (an even number) in " + eval.config_name);
      return gather_rows(src, interleaved_to_half_runs(rows, head_dim), name);
    }
    case MapRule::Op::kStack:
    case MapRule::Op::kUnstack: break;  // several sources to one target, or one to several: Stacks, unstack_targets
  }
  fail(ErrorCode::kInternal, "unknown map operation");
}

void check_shape(const TensorEntry& t, const std::string& source, const std::vector<std::string>& dims,
                 const Evaluator& eval) {
  std::string want;
  Shape expected;
  for (const auto& d : dims) expected.push_back(eval(d));
  if (expected == t.shape) return;
  for (std::size_t i = 0; i < dims.size(); ++i) want += (i ? ", " : "") + dims[i] + " = " + std::to_string(expected[i]);
  fail(ErrorCode::kDataLoss, "tensor '" + t.name + "' (from '" + source + "') has shape " + shape_str(t.shape) +
                                 " but " + eval.config_name + " gives (" + want + ")");
}

}  // namespace

TensorEntry gather_rows(const TensorEntry& source, const std::vector<RowRun>& runs, const std::string& name) {
  if (source.shape.empty()) fail_invalid("tensor '" + source.name + "': a 0-dim tensor has no rows");
  TensorEntry out = source;
  out.name = name;
  out.chunks.clear();
  const int64_t rows = source.shape[0];
  int64_t base = 0;  // the output row of the run's first row
  for (const RowRun& run : runs) {
    if (run.count < 0 || run.step < 1 || run.start < 0 ||
        (run.count > 0 && run.start + (run.count - 1) * run.step >= rows))
      fail_invalid("tensor '" + source.name + "': rows " + std::to_string(run.start) + ", step " +
                   std::to_string(run.step) + ", count " + std::to_string(run.count) + " leave its " +
                   std::to_string(rows) + " rows");
    for (const TensorChunk& c : source.chunks) {
      const int64_t c0 = c.offsets[0], cn = c.sizes[0];
      const int64_t lo = std::max<int64_t>(0, ceil_div(c0 - run.start, run.step));
      const int64_t hi = std::min<int64_t>(run.count, ceil_div(c0 + cn - run.start, run.step));
      if (lo >= hi) continue;
      TensorChunk piece = c;
      piece.offsets[0] = base + lo;
      piece.sizes[0] = hi - lo;
      piece.storage_offset = c.storage_offset + (run.start + lo * run.step - c0) * c.strides[0];
      piece.strides[0] = c.strides[0] * run.step;
      out.chunks.push_back(std::move(piece));
    }
    base += run.count;
  }
  out.shape[0] = base;
  return out;
}

std::vector<RowRun> split_runs(int64_t groups, const std::vector<int64_t>& sections, std::size_t index) {
  int64_t block = 0, before = 0;
  for (std::size_t i = 0; i < sections.size(); ++i) {
    if (i < index) before += sections[i];
    block += sections[i];
  }
  std::vector<RowRun> runs;
  for (int64_t g = 0; g < groups; ++g) runs.push_back({g * block + before, sections.at(index), 1});
  return runs;
}

std::vector<RowRun> interleaved_to_half_runs(int64_t rows, int64_t head_dim) {
  std::vector<RowRun> runs;
  for (int64_t h = 0; h < rows; h += head_dim) {
    runs.push_back({h, head_dim / 2, 2});
    runs.push_back({h + 1, head_dim / 2, 2});
  }
  return runs;
}

void place_slice(TensorEntry& stacked, const TensorEntry& slice, int64_t index) {
  if (stacked.shape.empty() || index < 0 || index >= stacked.shape[0] ||
      !std::equal(slice.shape.begin(), slice.shape.end(), stacked.shape.begin() + 1, stacked.shape.end()))
    fail_invalid("tensor '" + slice.name + "' of shape " + shape_str(slice.shape) + " cannot be index " +
                 std::to_string(index) + " of '" + stacked.name + "' " + shape_str(stacked.shape));
  for (const TensorChunk& c : slice.chunks) {
    TensorChunk n = c;
    n.offsets.insert(n.offsets.begin(), index);
    n.sizes.insert(n.sizes.begin(), 1);
    // A dim of extent 1 may carry any stride: the slice's own extent, as a
    // contiguous stack would have it.
    n.strides.insert(n.strides.begin(), static_cast<int64_t>(c.numel()));
    stacked.chunks.push_back(std::move(n));
  }
}

TensorEntry slice_of(const TensorEntry& source, int64_t index, const std::string& name) {
  if (source.shape.empty() || index < 0 || index >= source.shape[0])
    fail_invalid("tensor '" + source.name + "' " + shape_str(source.shape) + " has no index " + std::to_string(index) +
                 " to unstack");
  TensorEntry out = source;
  out.name = name;
  out.shape.erase(out.shape.begin());
  out.chunks.clear();
  for (const TensorChunk& c : source.chunks) {
    if (index < c.offsets[0] || index >= c.offsets[0] + c.sizes[0]) continue;
    TensorChunk n = c;
    n.storage_offset = c.storage_offset + (index - c.offsets[0]) * c.strides[0];
    n.offsets.erase(n.offsets.begin());
    n.sizes.erase(n.sizes.begin());
    n.strides.erase(n.strides.begin());
    out.chunks.push_back(std::move(n));
  }
  return out;
}

namespace {

ArchMap parse_map(const std::string& text, const std::string& name, const std::string& origin, int depth);

// "extends": the built-in map named, parsed as the base of this one.
ArchMap base_map(const std::string& base, const std::string& where, int depth) {
  if (depth > 4) fail_invalid(where + ": \"extends\" nests deeper than 4 maps");
  for (const auto& [name, text] : builtin_arch_map_texts())
    if (name == base) return parse_map(text, name, "built in", depth + 1);
  std::string names;
  for (const auto& [name, text] : builtin_arch_map_texts()) names += (names.empty() ? "" : ", ") + name;
  fail_invalid(where + ": \"extends\": no built-in map '" + base + "' (built in: " + names + ")");
}

ArchMap parse_map(const std::string& text, const std::string& name, const std::string& origin, int depth) {
  const std::string where = "map " + name + " (" + origin + ")";
  nlohmann::ordered_json j;
  try {
    j = parse_checkpoint_json(text, where);
  } catch (const Error& e) {
    fail_invalid(e.message());  // a map is part of the request
  }
  if (!j.is_object()) fail_invalid(where + ": a map is a JSON object");
  JsonMembers m(j, where);
  static const std::set<std::string> kKnown = {
      "description", "extends", "source_kinds", "architectures",      "indices",         "defaults", "rules",
      "skip",        "comment", "back_none",    "back_architectures", "skip_unless_zero"};
  for (const auto& [k, v] : j.items())
    if (!kKnown.count(k)) fail_invalid(where + ": unknown key \"" + k + "\"");
  ArchMap map;
  if (const auto* e = m.find("extends")) map = base_map(as_string(*e, where + ".extends"), where, depth);
  map.source_kinds.clear();
  map.architectures.clear();
  map.back_architectures.clear();
  map.name = name;
  map.origin = origin;
  if (const auto* d = m.find("description")) map.description = as_string(*d, where + ".description");
  if (const auto* s = m.find("source_kinds")) map.source_kinds = as_strings(*s, where + ".source_kinds", false);
  if (const auto* a = m.find("architectures")) map.architectures = as_strings(*a, where + ".architectures", false);
  if (const auto* a = m.find("back_architectures"))
    map.back_architectures = as_strings(*a, where + ".back_architectures", false);
  for (const char* key : {"indices", "defaults"}) {
    const auto* o = m.find(key);
    if (!o) continue;
    if (!o->is_object()) fail_invalid(where + "." + key + ": an object of expressions");
    for (const auto& [k, v] : o->items())
      (std::string(key) == "indices" ? map.indices : map.defaults)[k] = as_expression(v, where + "." + key + "." + k);
  }
  const auto& rules = member(m, "rules", where);
  if (!rules.is_array() || rules.empty()) fail_invalid(where + ".rules: a non-empty list of rules");
  for (std::size_t i = 0; i < rules.size(); ++i)
    map.rules.push_back(parse_rule(rules[i], where + ".rules[" + std::to_string(i) + "]"));
  if (const auto* s = m.find("skip"))
    for (auto& p : as_strings(*s, where + ".skip", false)) map.skip.push_back(std::move(p));
  if (const auto* z = m.find("skip_unless_zero")) {
    if (!z->is_object()) fail_invalid(where + ".skip_unless_zero: an object of patterns and what each tensor does");
    for (const auto& [k, v] : z->items()) map.skip_unless_zero[k] = as_string(v, where + ".skip_unless_zero." + k);
  }
  if (const auto* b = m.find("back_none"))
    for (auto& p : as_strings(*b, where + ".back_none", false)) map.back_none.push_back(std::move(p));
  for (const auto& r : map.rules)
    for (const auto& n : compile_pattern(r.from[0], where).names)
      if (!map.indices.count(n))
        fail_invalid(where + ": '" + r.from[0] + "' uses {" + n + "}, which \"indices\" does not count");
  for (const auto& r : map.rules)
    if (!r.unstack.empty() && !map.indices.count(r.unstack))
      fail_invalid(where + ": unstack into {" + r.unstack + "}, which \"indices\" does not count");
  for (const auto& b : map.back_none)
    for (const auto& n : compile_pattern(b, where).names)
      if (!map.indices.count(n))
        fail_invalid(where + ".back_none: '" + b + "' uses {" + n + "}, which \"indices\" does not count");
  return map;
}

}  // namespace

ArchMap parse_arch_map(const std::string& text, const std::string& name, const std::string& origin) {
  return parse_map(text, name, origin, 0);
}

const std::vector<ArchMap>& builtin_arch_maps() {
  static const std::vector<ArchMap> maps = parse_builtins();
  return maps;
}

const ArchMap* find_builtin_arch_map(const std::string& name) {
  for (const auto& m : builtin_arch_maps())
    if (m.name == name) return &m;
  return nullptr;
}

const ArchMap* builtin_arch_map_for(const std::string& source_format, const std::string& architecture) {
  for (const auto& m : builtin_arch_maps()) {
    bool kind = std::find(m.source_kinds.begin(), m.source_kinds.end(), source_format) != m.source_kinds.end();
    bool arch = std::find(m.architectures.begin(), m.architectures.end(), architecture) != m.architectures.end();
    if (kind && arch) return &m;
  }
  return nullptr;
}

namespace {

using Captured = std::map<std::string, std::string>;  // placeholder -> the index a name gave it
using Entries = std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>>;

// More slices than any model has experts or layers: a count past it comes
// from a hostile file (a stack's config or an unstacked tensor's shape), and
// would be a loop and an allocation that size.
constexpr int64_t kMaxSlices = int64_t{1} << 20;

// Calls `fn` with every combination of the placeholders `names` (each from
// 0 to its count in the map's indices) set in `values`.
void each_index(const std::vector<std::string>& names, std::size_t k, const ArchMap& map, const Evaluator& eval,
                Captured& values, const std::function<void()>& fn) {
  if (k == names.size()) return fn();
  const int64_t count = eval(map.indices.at(names[k]));
  for (int64_t i = 0; i < count; ++i) {
    values[names[k]] = std::to_string(i);
    each_index(names, k + 1, map, eval, values, fn);
  }
}

// The targets of stack rules: each made at its first slice (its shape the
// rule's, from the config), every index given once, and complete at the end.
class Stacks {
 public:
  Stacks(const ArchMap& map, const Evaluator& eval, const std::string& where) : map_(map), eval_(eval), where_(where) {}

  // `src` at the index the rule's stack expression gives with `values`.
  void add(std::size_t r, const TensorEntry& src, const Captured& values, std::map<std::string, std::string>& written,
           CheckpointModel& out, Entries& entries) {
    const MapRule& rule = map_.rules[r];
    const std::string name = substitute(rule.to.front(), values);
    auto it = targets_.find(name);
    if (it == targets_.end()) {
      auto [w, fresh] = written.emplace(name, src.name);
      if (!fresh)
        fail(ErrorCode::kUnimplemented,
             where_ + ": '" + w->second + "' and '" + src.name + "' both become '" + name + "'");
      TensorEntry t = src;
      t.name = name;
      t.chunks.clear();
      t.shape.clear();
      for (const auto& d : rule.shapes.front()) t.shape.push_back(eval_(d));
      if (t.shape.front() < 0 || t.shape.front() > kMaxSlices)
        fail(ErrorCode::kDataLoss, "tensor '" + name + "': " + rule.shapes.front().front() + " = " +
                                       std::to_string(t.shape.front()) + " slices in " + eval_.config_name);
      entries.emplace_back(pickle::Value::str(name), make_tensor_ref(out.tensors.size()));
      it = targets_.emplace(name, Target{out.tensors.size(), r, std::vector<std::string>(t.shape[0])}).first;
      out.tensors.push_back(std::move(t));
    }
    TensorEntry& t = out.tensors[it->second.tensor];
    const auto& dims = rule.shapes.front();
    if (!std::equal(src.shape.begin(), src.shape.end(), t.shape.begin() + 1, t.shape.end()) || src.dtype != t.dtype) {
      std::string want;
      for (std::size_t i = 1; i < dims.size(); ++i)
        want += (i > 1 ? ", " : "") + dims[i] + " = " + std::to_string(t.shape[i]);
      fail(ErrorCode::kDataLoss, "tensor '" + src.name + "' (" + std::string(dtype_name(src.dtype)) + " " +
                                     shape_str(src.shape) + ") cannot be a slice of '" + name + "' (" +
                                     std::string(dtype_name(t.dtype)) + "): " + eval_.config_name + " gives (" + want +
                                     ")");
    }
    ConfigFields with = eval_.config;
    for (const auto& [k, v] : values) {
      if (v.size() > 18)
        fail(ErrorCode::kDataLoss, "tensor '" + src.name + "': index " + k + " = " + v + " is too large");
      with[k] = std::stoll(v);
    }
    const int64_t index = Evaluator{map_, with, eval_.config_name}(rule.stack);
    auto& sources = it->second.sources;
    if (index < 0 || index >= t.shape[0])
      fail(ErrorCode::kDataLoss, "tensor '" + src.name + "' would be index " + std::to_string(index) + " (" +
                                     rule.stack + ") of '" + name + "', whose " + dims.front() + " = " +
                                     std::to_string(t.shape[0]) + " in " + eval_.config_name);
    if (!sources[index].empty())
      fail(ErrorCode::kUnimplemented, where_ + ": '" + sources[index] + "' and '" + src.name + "' both become index " +
                                          std::to_string(index) + " of '" + name + "'");
    sources[index] = src.name;
    place_slice(t, src, index);
  }

  // Every target each stack rule names (its placeholders' every index) made,
  // no other, and every index of each given: a missing expert would load as
  // a freshly initialised one.
  void check_complete(const std::vector<bool>& off) const {
    for (std::size_t r = 0; r < map_.rules.size(); ++r) {
      const MapRule& rule = map_.rules[r];
      if (rule.op != MapRule::Op::kStack || rule.optional || off[r]) continue;
      std::size_t expected = 0, made = 0;
      Captured values;
      each_index(compile_pattern(rule.to.front(), where_).names, 0, map_, eval_, values, [&] {
        ++expected;
        const std::string name = substitute(rule.to.front(), values);
        if (!targets_.count(name))
          fail(ErrorCode::kNotFound, "tensor '" + name + "' has no slice: no tensor matches '" + rule.from[0] +
                                         "' there (" + where_ + "; --map none writes the source's names)");
      });
      for (const auto& [name, t] : targets_) {
        if (t.rule != r) continue;
        ++made;
        for (std::size_t i = 0; i < t.sources.size(); ++i)
          if (t.sources[i].empty())
            fail(ErrorCode::kNotFound, "tensor '" + name + "' has no index " + std::to_string(i) + ": no tensor '" +
                                           rule.from[0] + "' gives it (" + rule.stack + "; " + where_ + ")");
      }
      if (made != expected)
        fail(ErrorCode::kDataLoss, where_ + ": '" + rule.from[0] + "' makes " + std::to_string(made) +
                                       " tensors, not the " + std::to_string(expected) + " " + eval_.config_name +
                                       " counts");
    }
  }

 private:
  struct Target {
    std::size_t tensor;                // in the output model
    std::size_t rule;                  // the rule that made it
    std::vector<std::string> sources;  // per index, the source given there ("" none yet)
  };
  const ArchMap& map_;
  const Evaluator& eval_;
  const std::string& where_;
  std::map<std::string, Target> targets_;
};

// unstack: a target per index of `src`'s leading dim (its placeholder set
// to the index), as many as the map's indices count. Returns the first
// target's name, the one the completeness check looks for.
std::string unstack_targets(const MapRule& rule, const TensorEntry& src, Captured values, const ArchMap& map,
                            const Evaluator& eval, std::map<std::string, std::string>& written, CheckpointModel& out,
                            Entries& entries, const std::string& where) {
  const int64_t count = eval(map.indices.at(rule.unstack));
  if (src.shape.empty() || src.shape[0] != count || count > kMaxSlices)
    fail(ErrorCode::kDataLoss, "tensor '" + src.name + "' " + shape_str(src.shape) + " does not unstack into " +
                                   map.indices.at(rule.unstack) + " = " + std::to_string(count) + " of " +
                                   eval.config_name);
  std::string first;
  for (int64_t i = 0; i < count; ++i) {
    values[rule.unstack] = std::to_string(i);
    const std::string name = substitute(rule.to.front(), values);
    if (i == 0) first = name;
    auto [it, fresh] = written.emplace(name, src.name);
    if (!fresh)
      fail(ErrorCode::kUnimplemented,
           where + ": '" + it->second + "' and '" + src.name + "' both become '" + name + "'");
    TensorEntry t = slice_of(src, i, name);
    check_shape(t, src.name, rule.shapes.front(), eval);
    entries.emplace_back(pickle::Value::str(name), make_tensor_ref(out.tensors.size()));
    out.tensors.push_back(std::move(t));
  }
  return first;
}

// tie: the copies the tie rules (those not off) make of `src`, besides
// the rule that claims it. True when one did.
bool write_ties(const TensorEntry& src, const std::string& path, const ArchMap& map,
                const std::vector<std::vector<Pattern>>& from, const std::vector<bool>& off, const Evaluator& eval,
                std::map<std::string, std::string>& written, std::vector<std::set<std::string>>& seen,
                CheckpointModel& out, Entries& entries, const std::string& where) {
  bool tied = false;
  for (std::size_t r = 0; r < map.rules.size(); ++r) {
    const MapRule& rule = map.rules[r];
    if (!rule.tie || off[r]) continue;
    RegexMatch m;
    const Pattern* hit = nullptr;
    for (const auto& p : from[r])
      if (!hit && p.re.match(path, m)) hit = &p;
    if (!hit) continue;
    Captured values;
    for (std::size_t i = 0; i < hit->names.size(); ++i) values[hit->names[i]] = m.str(i + 1);
    seen[r].insert(substitute(rule.to.front(), values));
    for (std::size_t i = 0; i < rule.to.size(); ++i) {
      const std::string name = substitute(rule.to[i], values);
      auto [it, fresh] = written.emplace(name, path);
      if (!fresh)
        fail(ErrorCode::kUnimplemented, where + ": '" + it->second + "' and '" + path + "' both become '" + name + "'");
      TensorEntry t = target_tensor(src, rule, i, name, eval);
      check_shape(t, path, rule.shapes[i], eval);
      entries.emplace_back(pickle::Value::str(name), make_tensor_ref(out.tensors.size()));
      out.tensors.push_back(std::move(t));
    }
    tied = true;
  }
  return tied;
}

// The name the completeness check looks for: the first target, an unstack
// rule's at index 0.
std::string first_target(const MapRule& rule, Captured values) {
  if (!rule.unstack.empty()) values[rule.unstack] = "0";
  return substitute(rule.to.front(), values);
}

}  // namespace

CheckpointModel apply_arch_map(const CheckpointModel& model, const ArchMap& map, const ConfigFields& config,
                               const std::string& config_name, std::vector<DroppedTensor>* unless_zero) {
  const Evaluator eval{map, config, config_name};
  const std::string where = "map " + map.name + " (" + map.origin + ")";
  std::vector<std::vector<Pattern>> from;  // per rule, its alternatives
  std::vector<Pattern> skip;
  for (const auto& r : map.rules) {
    from.emplace_back();
    for (const auto& f : r.from) from.back().push_back(compile_pattern(f, where));
  }
  for (const auto& s : map.skip) skip.push_back(compile_pattern(s, where));
  std::vector<std::pair<Pattern, std::string>> skip_zero;
  for (const auto& [s, why] : map.skip_unless_zero) skip_zero.emplace_back(compile_pattern(s, where), why);

  CheckpointModel out;
  out.info = model.info;
  out.source = model.source;
  out.facts = model.facts;
  std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>> entries;
  std::map<std::string, std::string> written;                 // target -> source, for duplicates
  std::vector<std::set<std::string>> seen(map.rules.size());  // the first targets each rule wrote
  std::vector<bool> off(map.rules.size());
  for (std::size_t r = 0; r < map.rules.size(); ++r)
    off[r] = !map.rules[r].unless.empty() && eval(map.rules[r].unless) != 0;
  Stacks stacks(map, eval, where);
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    if (!leaf.tensor) return;  // plain values: a model folder holds tensors only
    const TensorEntry& src = model.tensors[*leaf.tensor];
    RegexMatch m;
    for (const auto& s : skip)
      if (s.re.match(leaf.path)) return;
    for (const auto& [s, why] : skip_zero)
      if (s.re.match(leaf.path)) {
        if (unless_zero) unless_zero->push_back({*leaf.tensor, why});
        return;
      }
    const bool tied = write_ties(src, leaf.path, map, from, off, eval, written, seen, out, entries, where);
    for (std::size_t r = 0; r < map.rules.size(); ++r) {
      if (off[r] || map.rules[r].tie) continue;
      const Pattern* hit = nullptr;
      for (const auto& p : from[r])
        if (!hit && p.re.match(leaf.path, m)) hit = &p;
      if (!hit) continue;
      const MapRule& rule = map.rules[r];
      std::map<std::string, std::string> values;
      for (std::size_t i = 0; i < hit->names.size(); ++i) values[hit->names[i]] = m.str(i + 1);
      if (rule.op == MapRule::Op::kStack) return stacks.add(r, src, values, written, out, entries);
      if (rule.op == MapRule::Op::kUnstack) {
        seen[r].insert(unstack_targets(rule, src, values, map, eval, written, out, entries, where));
        return;
      }
      seen[r].insert(substitute(rule.to.front(), values));
      for (std::size_t i = 0; i < rule.to.size(); ++i) {
        const std::string name = substitute(rule.to[i], values);
        auto [it, fresh] = written.emplace(name, leaf.path);
        if (!fresh)
          fail(ErrorCode::kUnimplemented,
               where + ": '" + it->second + "' and '" + leaf.path + "' both become '" + name + "'");
        TensorEntry t = target_tensor(src, rule, i, name, eval);
        check_shape(t, leaf.path, rule.shapes[i], eval);
        entries.emplace_back(pickle::Value::str(name), make_tensor_ref(out.tensors.size()));
        out.tensors.push_back(std::move(t));
      }
      return;
    }
    if (tied) return;  // a tensor only a tie copies is written all the same
    for (std::size_t r = 0; r < map.rules.size(); ++r)
      for (const auto& p : from[r])
        if (off[r] && p.re.match(leaf.path))
          fail(ErrorCode::kDataLoss, "tensor '" + leaf.path + "' has no place in the model " + config_name +
                                         " describes: its " + map.rules[r].unless + " leaves it out (" + where + ")");
    fail(ErrorCode::kUnimplemented, "tensor '" + leaf.path + "' matches no rule of " + where +
                                        " (a map for another model, or --only model missing?)");
  });
  // Every index of every rule present: a missing layer would load as a
  // freshly initialised one.
  for (std::size_t r = 0; r < map.rules.size(); ++r) {
    const MapRule& rule = map.rules[r];
    if (rule.optional || off[r] || rule.op == MapRule::Op::kStack) continue;  // stacks: Stacks::check_complete
    const std::vector<std::string>& names = from[r][0].names;
    std::map<std::string, std::string> values;
    std::function<void(std::size_t)> each = [&](std::size_t k) {
      if (k == names.size()) {
        if (seen[r].count(first_target(rule, values))) return;
        std::string name;
        for (const auto& f : rule.from) name += (name.empty() ? "'" : "' or '") + substitute(f, values);
        fail(ErrorCode::kNotFound, "tensor " + name + "' is missing: " + where + " needs it for '" +
                                       first_target(rule, values) + "' (--map none writes the source's names)");
      }
      const std::string& n = names[k];
      const int64_t count = eval(map.indices.at(n));
      for (int64_t i = 0; i < count; ++i) {
        values[n] = std::to_string(i);
        each(k + 1);
      }
    };
    each(0);
    std::size_t expected = 1;
    for (const auto& n : names) expected *= static_cast<std::size_t>(eval(map.indices.at(n)));
    if (seen[r].size() != expected)
      fail(ErrorCode::kDataLoss, where + ": '" + rule.from[0] + "' matches " + std::to_string(seen[r].size()) +
                                     " tensors, not the " + std::to_string(expected) + " " + config_name + " counts");
  }
  stacks.check_complete(off);
  out.root = pickle::Value::dict(std::move(entries));
  require_valid(out);
  return out;
}

int64_t evaluate_map_expression(const std::string& text, const ArchMap& map, const ConfigFields& config,
                                const std::string& config_name) {
  return Evaluator{map, config, config_name}(text);
}

std::string substitute_indices(const std::string& pattern, const std::map<std::string, std::string>& values) {
  return substitute(pattern, values);
}

std::vector<std::string> pattern_indices(const std::string& pattern) {
  return compile_pattern(pattern, "pattern").names;
}

std::optional<std::map<std::string, std::string>> match_pattern(const std::string& pattern, const std::string& name) {
  const Pattern p = compile_pattern(pattern, "pattern");
  RegexMatch m;
  if (!p.re.match(name, m)) return std::nullopt;
  std::map<std::string, std::string> values;
  for (std::size_t i = 0; i < p.names.size(); ++i) values[p.names[i]] = m.str(i + 1);
  return values;
}

}  // namespace ckpt
