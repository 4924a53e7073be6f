#include "pickle/value.h"

#include <cstdio>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/budgets.h"
#include "core/error.h"
#include "core/units.h"
#include "pickle/encodings.h"

namespace ckpt::pickle {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kBigInt: return "big int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kSet: return "set";
    case Kind::kFrozenSet: return "frozenset";
    case Kind::kGlobal: return "global";
    case Kind::kCall: return "call";
    case Kind::kBuilt: return "built object";
    case Kind::kPersId: return "persistent id";
  }
  return "unknown";
}

// ---- construction ----

namespace {

ValuePtr make_bool(bool v) {
  auto p = std::make_shared<Value>(Kind::kBool);
  p->bool_value = v;
  return p;
}

ValuePtr make_int(int64_t v) {
  auto p = std::make_shared<Value>(Kind::kInt);
  p->int_value = v;
  return p;
}

// Built on first use; C++ initialises function statics once, thread-safely.
const std::vector<ValuePtr>& small_ints() {
  static const std::vector<ValuePtr> ints = [] {
    std::vector<ValuePtr> out;
    for (int64_t i = Value::kMinConstantInt; i <= Value::kMaxConstantInt; ++i) out.push_back(make_int(i));
    return out;
  }();
  return ints;
}

const ValuePtr& none_constant() {
  static const ValuePtr none = std::make_shared<Value>(Kind::kNone);
  return none;
}

const ValuePtr& bool_constant(bool v) {
  static const ValuePtr t = make_bool(true), f = make_bool(false);
  return v ? t : f;
}

}  // namespace

bool Value::is_constant(const Value& v) {
  switch (v.kind) {
    case Kind::kNone: return &v == none_constant().get();
    case Kind::kBool: return &v == bool_constant(v.bool_value).get();
    case Kind::kInt:
      return v.int_value >= kMinConstantInt && v.int_value <= kMaxConstantInt &&
             &v == small_ints()[static_cast<std::size_t>(v.int_value - kMinConstantInt)].get();
    default: return false;
  }
}

ValuePtr Value::none() { return none_constant(); }

ValuePtr Value::boolean(bool v) { return bool_constant(v); }

ValuePtr Value::integer(int64_t v) {
  if (v >= kMinConstantInt && v <= kMaxConstantInt) return small_ints()[static_cast<std::size_t>(v - kMinConstantInt)];
  return make_int(v);
}

ValuePtr Value::big_integer(std::string le_twos_complement) {
  auto p = std::make_shared<Value>(Kind::kBigInt);
  p->text = std::move(le_twos_complement);
  return p;
}

ValuePtr Value::floating(double v) {
  auto p = std::make_shared<Value>(Kind::kFloat);
  p->float_value = v;
  return p;
}

ValuePtr Value::str(std::string v) {
  auto p = std::make_shared<Value>(Kind::kStr);
  p->text = std::move(v);
  return p;
}

ValuePtr Value::bytes(std::string v) {
  auto p = std::make_shared<Value>(Kind::kBytes);
  p->text = std::move(v);
  return p;
}

ValuePtr Value::tuple(std::vector<ValuePtr> items) {
  auto p = std::make_shared<Value>(Kind::kTuple);
  p->items = std::move(items);
  return p;
}

ValuePtr Value::list(std::vector<ValuePtr> items) {
  auto p = std::make_shared<Value>(Kind::kList);
  p->items = std::move(items);
  return p;
}

ValuePtr Value::dict(std::vector<std::pair<ValuePtr, ValuePtr>> entries, bool ordered) {
  auto p = std::make_shared<Value>(Kind::kDict);
  p->entries = std::move(entries);
  p->ordered = ordered;
  return p;
}

ValuePtr Value::global(std::string module, std::string name) {
  auto p = std::make_shared<Value>(Kind::kGlobal);
  p->text = std::move(module);
  p->name = std::move(name);
  return p;
}

ValuePtr Value::call(ValuePtr callable, ValuePtr args, ValuePtr kwargs) {
  auto p = std::make_shared<Value>(Kind::kCall);
  p->callable = std::move(callable);
  p->args = std::move(args);
  p->kwargs = std::move(kwargs);
  return p;
}

ValuePtr Value::built(ValuePtr object, ValuePtr state) {
  auto p = std::make_shared<Value>(Kind::kBuilt);
  p->object = std::move(object);
  p->state = std::move(state);
  return p;
}

ValuePtr Value::persistent_id(ValuePtr pid) {
  auto p = std::make_shared<Value>(Kind::kPersId);
  p->pid = std::move(pid);
  return p;
}

// ---- inspection ----

namespace {
[[noreturn]] void fail_kind(const char* expected, Kind actual) {
  fail_data_loss(std::string("expected ") + expected + " in pickle, found " + kind_name(actual));
}
}  // namespace

bool Value::is_global(std::string_view module, std::string_view qualname) const {
  return kind == Kind::kGlobal && text == module && name == qualname;
}

int64_t Value::as_int() const {
  if (kind == Kind::kBigInt) fail_data_loss("integer " + repr() + " in pickle does not fit in 64 bits");
  if (kind != Kind::kInt) fail_kind("int", kind);
  return int_value;
}

double Value::as_number() const {
  if (kind == Kind::kInt) return static_cast<double>(int_value);
  if (kind != Kind::kFloat) fail_kind("int or float", kind);
  return float_value;
}

bool Value::as_bool() const {
  if (kind != Kind::kBool) fail_kind("bool", kind);
  return bool_value;
}

const std::string& Value::as_str() const {
  if (kind != Kind::kStr) fail_kind("str", kind);
  return text;
}

const std::string& Value::as_bytes() const {
  if (kind != Kind::kBytes) fail_kind("bytes", kind);
  return text;
}

const std::vector<ValuePtr>& Value::as_sequence() const {
  if (kind != Kind::kTuple && kind != Kind::kList) fail_kind("tuple or list", kind);
  return items;
}

ValuePtr Value::get(std::string_view key) const {
  if (kind != Kind::kDict) fail_kind("dict", kind);
  // Searched from the back: a key set twice keeps its last value, as in Python.
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (it->first && it->first->kind == Kind::kStr && it->first->text == key) return it->second;
  }
  return nullptr;
}

ValuePtr Value::at(std::string_view key) const {
  ValuePtr v = get(key);
  if (!v) fail_data_loss("dict in pickle has no key '" + std::string(key) + "'");
  return v;
}

ValuePtr bytes_io_object(const Value& bytes) {
  ValuePtr object = Value::call(Value::global("_io", "BytesIO"), Value::tuple({}));
  object->newobj = true;
  ValuePtr data = Value::bytes(bytes.text);
  return Value::built(std::move(object), Value::tuple({data, Value::integer(bytes.int_value), Value::none()}));
}

const Value* find_node(const Value& root, const std::function<bool(const Value&)>& match) {
  // The walk only reads: the const_cast lets both forms share it.
  return find_node(const_cast<Value&>(root), [&](Value& v) { return match(v); });
}

Value* find_node(Value& root, const std::function<bool(Value&)>& match) {
  std::unordered_set<const Value*> seen{&root};
  std::vector<Value*> todo{&root};
  auto push = [&](const ValuePtr& v) {
    if (v && seen.insert(v.get()).second) todo.push_back(v.get());
  };
  while (!todo.empty()) {
    Value* v = todo.back();
    todo.pop_back();
    if (match(*v)) return v;
    for (const auto& item : v->items) push(item);
    for (const auto& [key, value] : v->entries) {
      push(key);
      push(value);
    }
    for (const ValuePtr* p : {&v->callable, &v->args, &v->kwargs, &v->object, &v->state, &v->pid}) push(*p);
  }
  return nullptr;
}

namespace {

// Classes whose instances Python cannot hash (__hash__ is None: dataclasses
// with eq and without frozen, dict subclasses), among those a checkpoint's
// pickles build.
bool unhashable_class(const Value& g) {
  static const std::pair<std::string_view, std::string_view> kClasses[] = {
      {"collections", "OrderedDict"},
      {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "TensorProperties"},
      {"torch.distributed.checkpoint.metadata", "Metadata"},
      {"torch.distributed.checkpoint.metadata", "StorageMeta"},
      {"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
      {"torch.distributed._shard.sharded_tensor.metadata", "ShardedTensorMetadata"},
      {"torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"},
  };
  for (const auto& [module, name] : kClasses)
    if (g.is_global(module, name)) return true;
  return false;
}

// A tuple key nested deeper than this is refused rather than walked.
constexpr int kMaxKeyDepth = 100;

// A tag, the length and the bytes: no two texts of different kinds or
// splits give the same string.
void append_text(char tag, const std::string& text, std::string& out) {
  char len[24];
  int n = std::snprintf(len, sizeof len, "%c%zu:", tag, text.size());
  out.append(len, static_cast<std::size_t>(n));
  out.append(text);
}

// A tag, the number and `end` ("n42;"), appended in place: the same bytes as
// `tag + std::to_string(v) + end`, which GCC 12 warns on (-Wrestrict, a false
// positive of operator+ on a temporary string).
void append_number(char tag, int64_t v, std::string& out, char end = ';') {
  out += tag;
  out += std::to_string(v);
  out += end;
}

[[noreturn]] void key_too_large(std::size_t max_size) {
  fail(ErrorCode::kUnsafe, "a dict key expands to more than " + human_bytes(static_cast<double>(max_size)) +
                               " when each shared part is counted where it appears (a key that references one "
                               "tuple from many places): the pickle-memory budget; " +
                               budget_hint("pickle-memory"));
}

bool append_identity(const Value& v, std::string& out, int depth, std::size_t max_size) {
  // A key of tuples that share one tuple (each level the previous one
  // twice) is a few bytes of pickle whose identity doubles per level: the
  // size is checked as it grows, before it is ever hashed or compared.
  if (out.size() > max_size) key_too_large(max_size);
  char buf[64];
  switch (v.kind) {
    case Kind::kNone: out += "N;"; return true;
    case Kind::kBool: out += v.bool_value ? "n1;" : "n0;"; return true;
    case Kind::kInt: append_number('n', v.int_value, out); return true;
    case Kind::kBigInt: append_text('B', v.text, out); return true;
    case Kind::kFloat: {
      double f = v.float_value;
      if (f != f) break;  // NaN equals nothing, itself only by identity
      if (f == static_cast<double>(static_cast<int64_t>(f)) && f >= -9.2e18 && f <= 9.2e18) {
        append_number('n', static_cast<int64_t>(f), out);
        return true;
      }
      std::snprintf(buf, sizeof buf, "f%a;", f);
      out += buf;
      return true;
    }
    case Kind::kStr: append_text('s', v.text, out); return true;
    case Kind::kBytes:
      if (v.bytearray) return false;
      append_text('b', v.text, out);
      return true;
    case Kind::kTuple:
      if (depth >= kMaxKeyDepth)
        fail_data_loss("a dict key of tuples nested deeper than " + std::to_string(kMaxKeyDepth));
      out += "(";
      for (const auto& item : v.items)
        if (!item || !append_identity(*item, out, depth + 1, max_size)) return false;
      out += ")";
      return true;
    case Kind::kList:
    case Kind::kDict:
    case Kind::kSet: return false;
    case Kind::kCall:
      if (v.callable && unhashable_class(*v.callable)) return false;
      break;
    case Kind::kBuilt:
      if (v.object && v.object->is(Kind::kCall) && v.object->callable && unhashable_class(*v.object->callable))
        return false;
      break;
    case Kind::kGlobal:
      append_number('g', static_cast<int64_t>(v.text.size()), out, ':');
      out += v.text;
      out += '.';
      out += v.name;
      out += ';';
      return true;
    case Kind::kFrozenSet:
    case Kind::kPersId: break;
  }
  std::snprintf(buf, sizeof buf, "o%p;", static_cast<const void*>(&v));
  out += buf;
  return true;
}

// The nodes of a key counted once per path that reaches them (a tuple that
// holds one tuple twice counts it twice), saturating above `limit`: a lower
// bound on its identity's length, found in one pass over its distinct nodes.
uint64_t expanded_nodes(const Value& v, uint64_t limit, int depth, std::unordered_map<const Value*, uint64_t>& memo) {
  if (!v.is(Kind::kTuple) || depth >= kMaxKeyDepth) return 1;
  if (auto it = memo.find(&v); it != memo.end()) return it->second;
  uint64_t n = 1;
  for (const auto& item : v.items)
    if (item) n = std::min(limit + 1, n + expanded_nodes(*item, limit, depth + 1, memo));
  memo.emplace(&v, n);
  return n;
}

}  // namespace

std::optional<std::string> dict_key_identity(const Value& key, std::size_t max_size) {
  if (key.is(Kind::kTuple)) {
    std::unordered_map<const Value*, uint64_t> memo;
    if (expanded_nodes(key, max_size, 0, memo) > max_size) key_too_large(max_size);
  }
  std::string out;
  if (!append_identity(key, out, 0, max_size)) return std::nullopt;
  if (out.size() > max_size) key_too_large(max_size);
  return out;
}

}  // namespace ckpt::pickle
