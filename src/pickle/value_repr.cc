// Value::repr: a Python-like rendering for messages and `inspect`, bounded in
// nesting depth, items per container, string length and total length, so a
// hostile (or merely huge, or heavily shared) tree renders in bounded time.
#include <charconv>
#include <cmath>
#include <cstdio>

#include "pickle/encodings.h"
#include "pickle/value.h"

namespace ckpt::pickle {
namespace {

constexpr std::size_t kMaxReprChars = 4096;
constexpr std::size_t kMaxStrChars = 80;
constexpr std::size_t kMaxBigIntBytes = 128;

class ReprWriter {
 public:
  explicit ReprWriter(std::size_t max_items) : max_items_(max_items) {}

  std::string finish() {
    if (out_.size() > kMaxReprChars) {
      out_.resize(kMaxReprChars);
      out_ += "...";
    }
    return std::move(out_);
  }

  void value(const Value* v, int depth);

 private:
  bool full() const { return out_.size() > kMaxReprChars; }
  void quoted(std::string_view s, char quote, bool as_bytes);
  void floating(double d);
  void sequence(const std::vector<ValuePtr>& items, int depth, const char* open, const char* close);
  void mapping(const std::vector<std::pair<ValuePtr, ValuePtr>>& entries, int depth);
  void call(const Value& v, int depth);

  std::size_t max_items_;
  std::string out_;
};

void ReprWriter::quoted(std::string_view s, char quote, bool as_bytes) {
  out_ += quote;
  std::size_t shown = 0;
  for (std::size_t i = 0; i < s.size(); ++i, ++shown) {
    if (shown == kMaxStrChars) {
      out_ += "...";
      break;
    }
    auto c = static_cast<unsigned char>(s[i]);
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out_ += '\\';
      out_ += static_cast<char>(c);
    } else if (c == '\n') {
      out_ += "\\n";
    } else if (c < 0x20 || c == 0x7f || (as_bytes && c >= 0x80)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out_ += buf;
    } else {
      out_ += static_cast<char>(c);  // UTF-8 passes through whole
    }
  }
  out_ += quote;
}

void ReprWriter::floating(double d) {
  if (std::isnan(d)) {
    out_ += "nan";
    return;
  }
  if (std::isinf(d)) {
    out_ += d < 0 ? "-inf" : "inf";
    return;
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
  std::string_view s(buf, end - buf);
  out_ += s;
  if (s.find_first_of(".e") == std::string_view::npos) out_ += ".0";
}

void ReprWriter::sequence(const std::vector<ValuePtr>& items, int depth, const char* open, const char* close) {
  out_ += open;
  if (depth <= 0 && !items.empty()) {
    out_ += "...";
  } else {
    for (std::size_t i = 0; i < items.size() && !full(); ++i) {
      if (i > 0) out_ += ", ";
      if (i == max_items_) {
        out_ += "... (" + std::to_string(items.size()) + " items)";
        break;
      }
      value(items[i].get(), depth - 1);
    }
  }
  out_ += close;
}

void ReprWriter::mapping(const std::vector<std::pair<ValuePtr, ValuePtr>>& entries, int depth) {
  out_ += '{';
  if (depth <= 0 && !entries.empty()) {
    out_ += "...";
  } else {
    for (std::size_t i = 0; i < entries.size() && !full(); ++i) {
      if (i > 0) out_ += ", ";
      if (i == max_items_) {
        out_ += "... (" + std::to_string(entries.size()) + " entries)";
        break;
      }
      value(entries[i].first.get(), depth - 1);
      out_ += ": ";
      value(entries[i].second.get(), depth - 1);
    }
  }
  out_ += '}';
}

// callable(arg, ...), with kwargs, appended items/entries and state shown
// only when present.
void ReprWriter::call(const Value& v, int depth) {
  value(v.callable.get(), depth - 1);
  if (v.args && v.args->kind == Kind::kTuple) {
    sequence(v.args->items, depth, "(", ")");
  } else {
    out_ += "(*";
    value(v.args.get(), depth - 1);
    out_ += ')';
  }
  if (v.kwargs) {
    out_ += "(**";
    value(v.kwargs.get(), depth - 1);
    out_ += ')';
  }
}

void ReprWriter::value(const Value* v, int depth) {
  if (full()) return;
  if (v == nullptr) {
    out_ += "<null>";
    return;
  }
  if (depth < 0) {  // only reached through calls and built objects
    out_ += "...";
    return;
  }
  switch (v->kind) {
    case Kind::kNone: out_ += "None"; break;
    case Kind::kBool: out_ += v->bool_value ? "True" : "False"; break;
    case Kind::kInt: out_ += std::to_string(v->int_value); break;
    case Kind::kBigInt:
      out_ += v->text.size() <= kMaxBigIntBytes ? twos_complement_to_decimal(v->text)
                                                : "<int of " + std::to_string(v->text.size()) + " bytes>";
      break;
    case Kind::kFloat: floating(v->float_value); break;
    case Kind::kStr: quoted(v->text, '\'', false); break;
    case Kind::kBytes:
      out_ += v->bytearray ? "bytearray(b" : v->bytes_io ? "BytesIO(b" : "b";
      quoted(v->text, '\'', true);
      if (v->bytearray || v->bytes_io) out_ += ')';
      break;
    case Kind::kTuple: sequence(v->items, depth, "(", v->items.size() == 1 ? ",)" : ")"); break;
    case Kind::kList: sequence(v->items, depth, "[", "]"); break;
    case Kind::kDict:
      if (v->ordered) out_ += "OrderedDict(";
      mapping(v->entries, depth);
      if (v->ordered) out_ += ')';
      break;
    case Kind::kSet:
    case Kind::kFrozenSet:
      out_ += v->kind == Kind::kSet ? "set(" : "frozenset(";
      if (!v->items.empty()) sequence(v->items, depth, "{", "}");
      out_ += ')';
      break;
    case Kind::kGlobal: out_ += v->text + "." + v->name; break;
    case Kind::kCall: call(*v, depth); break;
    case Kind::kBuilt:
      value(v->object.get(), depth - 1);
      out_ += ".__setstate__(";
      value(v->state.get(), depth - 1);
      out_ += ')';
      break;
    case Kind::kPersId:
      out_ += "persistent_id(";
      value(v->pid.get(), depth - 1);
      out_ += ')';
      break;
  }
  if (v->kind == Kind::kCall || v->kind == Kind::kBuilt) {
    if (!v->items.empty()) sequence(v->items, depth, " + [", "]");
    if (!v->entries.empty()) {
      out_ += " + ";
      mapping(v->entries, depth);
    }
  }
}

}  // namespace

std::string Value::repr(int max_depth, std::size_t max_items) const {
  ReprWriter writer(max_items);
  writer.value(this, max_depth);
  return writer.finish();
}

}  // namespace ckpt::pickle
