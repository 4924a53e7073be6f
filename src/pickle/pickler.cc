// Protocol-2 pickler. It writes what CPython's Lib/pickle.py writes at
// protocol 2 for the same objects (byte for byte for plain data), so both
// pickle.loads and torch's weights_only unpickler accept it:
//   - ints as BININT1/BININT2/BININT, else LONG1/LONG4 (pickle.encode_long);
//   - str as BINUNICODE, memoized;
//   - bytes as _codecs.encode(<latin-1 str>, 'latin1') (no BINBYTES before
//     protocol 3), bytearray as builtins.bytearray(<those bytes>);
//   - tuples as EMPTY_TUPLE / TUPLE1-3 / MARK...TUPLE, memoized after;
//   - lists and dicts memoized first, then filled with APPENDS/SETITEMS in
//     batches of 1000 (APPEND/SETITEM for a lone item);
//   - OrderedDict as collections.OrderedDict() + SETITEMS, sets as
//     builtins.set(list);
//   - module `builtins` written as Python 2's `__builtin__` (fix_imports).
// Every value that can be referenced twice is memoized by identity, so a
// ValuePtr shared in the tree (a storage) is one object again when loaded.
#include <cstring>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "pickle/encodings.h"
#include "pickle/opcodes.h"
#include "pickle/pickler.h"

namespace ckpt::pickle {
namespace {

constexpr std::size_t kBatchSize = 1000;  // pickle.Pickler._BATCHSIZE
constexpr int kMaxSaveDepth = 4096;       // recursion guard for hand-made trees

[[noreturn]] void fail_internal(std::string message) {
  fail(ErrorCode::kInternal, "cannot pickle value: " + std::move(message));
}

class Protocol2Pickler {
 public:
  std::string run(const Value& root) {
    op(Opcode::kProto);
    out_ += '\x02';
    save(root);
    op(Opcode::kStop);
    return std::move(out_);
  }

 private:
  void op(Opcode code) { out_ += static_cast<char>(code); }
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  void put(uint64_t index);
  void get(uint64_t index);
  uint64_t memoize(const void* key);
  // After an opcode that built `key` from values already written: a value
  // that recursion put in the memo meanwhile is fetched instead (pickle.py
  // does the same for recursive objects).
  void memoize_or_fetch(const void* key, int pops, bool pop_mark);

  void save(const Value& v);
  void save_ptr(const ValuePtr& v) {
    if (!v) fail_internal("null value in the tree");
    save(*v);
  }
  void save_kind(const Value& v);
  void save_int(int64_t v);
  void save_long_bytes(std::string_view le_bytes);
  void save_float(double d);
  void save_str(std::string_view utf8, const void* key);
  void save_bytes(const Value& v);
  void save_plain_bytes(std::string_view data, const void* key);
  void save_tuple(const Value& v);
  void save_global(const std::string& module, const std::string& name);
  void save_call(const Value& v);
  void save_set(const Value& v);
  void batch_appends(const std::vector<ValuePtr>& items);
  void batch_setitems(const std::vector<std::pair<ValuePtr, ValuePtr>>& entries);

  std::string out_;
  std::unordered_map<const void*, uint64_t> memo_;
  std::map<std::pair<std::string, std::string>, uint64_t> global_memo_;
  uint64_t next_memo_ = 0;
  int depth_ = 0;
  // pickle.py passes the literal 'latin1' for every bytes object, so it is
  // one memoized string.
  const std::string latin1_ = "latin1";
};

void Protocol2Pickler::put(uint64_t index) {
  if (index < 256) {
    op(Opcode::kBinPut);
    le(index, 1);
  } else {
    if (index > 0xffffffffu) fail_internal("more than 2^32 memo entries");
    op(Opcode::kLongBinPut);
    le(index, 4);
  }
}

void Protocol2Pickler::get(uint64_t index) {
  if (index < 256) {
    op(Opcode::kBinGet);
    le(index, 1);
  } else {
    op(Opcode::kLongBinGet);
    le(index, 4);
  }
}

uint64_t Protocol2Pickler::memoize(const void* key) {
  uint64_t index = next_memo_++;
  if (key != nullptr) memo_[key] = index;
  put(index);
  return index;
}

void Protocol2Pickler::memoize_or_fetch(const void* key, int pops, bool pop_mark) {
  auto it = memo_.find(key);
  if (it == memo_.end()) {
    memoize(key);
    return;
  }
  if (pop_mark) {
    op(Opcode::kPopMark);
  } else {
    for (int i = 0; i < pops; ++i) op(Opcode::kPop);
  }
  get(it->second);
}

void Protocol2Pickler::save(const Value& v) {
  if (auto it = memo_.find(&v); it != memo_.end()) {
    get(it->second);
    return;
  }
  if (++depth_ > kMaxSaveDepth) fail_internal("tree nests deeper than " + std::to_string(kMaxSaveDepth) + " levels");
  save_kind(v);
  --depth_;
}

void Protocol2Pickler::save_kind(const Value& v) {
  switch (v.kind) {
    case Kind::kNone: op(Opcode::kNone); break;
    case Kind::kBool: op(v.bool_value ? Opcode::kNewTrue : Opcode::kNewFalse); break;
    case Kind::kInt: save_int(v.int_value); break;
    case Kind::kBigInt: save_long_bytes(v.text); break;
    case Kind::kFloat: save_float(v.float_value); break;
    case Kind::kStr: save_str(v.text, &v); break;
    case Kind::kBytes: save_bytes(v); break;
    case Kind::kTuple: save_tuple(v); break;
    case Kind::kList:
      op(Opcode::kEmptyList);
      memoize(&v);
      batch_appends(v.items);
      break;
    case Kind::kDict:
      if (v.ordered) {
        save_global("collections", "OrderedDict");
        op(Opcode::kEmptyTuple);
        op(Opcode::kReduce);
      } else {
        op(Opcode::kEmptyDict);
      }
      memoize(&v);
      batch_setitems(v.entries);
      break;
    case Kind::kSet:
    case Kind::kFrozenSet: save_set(v); break;
    case Kind::kGlobal: save_global(v.text, v.name); break;
    case Kind::kCall: save_call(v); break;
    case Kind::kBuilt:
      save_ptr(v.object);
      save_ptr(v.state);
      op(Opcode::kBuild);
      memoize_or_fetch(&v, 1, false);
      batch_appends(v.items);
      batch_setitems(v.entries);
      break;
    case Kind::kPersId:
      save_ptr(v.pid);
      op(Opcode::kBinPersId);
      memoize_or_fetch(&v, 1, false);
      break;
  }
}

void Protocol2Pickler::save_int(int64_t v) {
  if (v >= 0 && v <= 0xff) {
    op(Opcode::kBinInt1);
    le(static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v <= 0xffff) {
    op(Opcode::kBinInt2);
    le(static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    op(Opcode::kBinInt);
    le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
  } else {
    save_long_bytes(int64_to_twos_complement(v));
  }
}

void Protocol2Pickler::save_long_bytes(std::string_view le_bytes) {
  if (le_bytes.size() < 256) {
    op(Opcode::kLong1);
    le(le_bytes.size(), 1);
  } else {
    if (le_bytes.size() > 0x7fffffff) fail_internal("integer of more than 2^31 bytes");
    op(Opcode::kLong4);
    le(le_bytes.size(), 4);
  }
  out_ += le_bytes;
}

void Protocol2Pickler::save_float(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  op(Opcode::kBinFloat);
  for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
}

void Protocol2Pickler::save_str(std::string_view utf8, const void* key) {
  if (utf8.size() > 0xffffffffu) fail_internal("str of more than 4 GiB at protocol 2");
  op(Opcode::kBinUnicode);
  le(utf8.size(), 4);
  out_ += utf8;
  memoize(key);
}

// pickle.py save_bytes below protocol 3: _codecs.encode(<latin-1 str>,
// 'latin1'). Empty bytes too: pickle.py writes builtins.bytes() for them,
// which torch's weights_only unpickler refuses. A bytearray is
// bytearray(<bytes>), as bytearray.__reduce_ex__ returns it.
void Protocol2Pickler::save_bytes(const Value& v) {
  if (v.bytearray) {
    save_global("builtins", "bytearray");
    save_plain_bytes(v.text, nullptr);
    op(Opcode::kTuple1);
    memoize(nullptr);
    op(Opcode::kReduce);
    memoize_or_fetch(&v, 1, false);
    return;
  }
  save_plain_bytes(v.text, &v);
}

void Protocol2Pickler::save_plain_bytes(std::string_view data, const void* key) {
  save_global("_codecs", "encode");
  save_str(latin1_to_utf8(data), nullptr);
  if (auto it = memo_.find(&latin1_); it != memo_.end()) {
    get(it->second);
  } else {
    save_str(latin1_, &latin1_);
  }
  op(Opcode::kTuple2);
  memoize(nullptr);
  op(Opcode::kReduce);
  if (key != nullptr) {
    memoize_or_fetch(key, 1, false);
  } else {
    memoize(nullptr);
  }
}

void Protocol2Pickler::save_tuple(const Value& v) {
  std::size_t n = v.items.size();
  if (n == 0) {
    op(Opcode::kEmptyTuple);
    return;
  }
  if (n > 3) op(Opcode::kMark);
  for (const auto& item : v.items) save_ptr(item);
  if (memo_.count(&v)) {  // recursion reached this tuple through a list or dict
    memoize_or_fetch(&v, static_cast<int>(n), n > 3);
    return;
  }
  static constexpr Opcode kTupleOps[] = {Opcode::kEmptyTuple, Opcode::kTuple1, Opcode::kTuple2, Opcode::kTuple3};
  op(n <= 3 ? kTupleOps[n] : Opcode::kTuple);
  memoize(&v);
}

void Protocol2Pickler::save_global(const std::string& module, const std::string& name) {
  auto key = std::make_pair(module, name);
  if (auto it = global_memo_.find(key); it != global_memo_.end()) {
    get(it->second);
    return;
  }
  if (module.find('\n') != std::string::npos || name.find('\n') != std::string::npos) {
    fail_internal("global name with a newline");
  }
  // Lib/_compat_pickle.py REVERSE_IMPORT_MAPPING, as pickle.py applies it.
  std::string written = module == "builtins" ? "__builtin__" : module == "copyreg" ? "copy_reg" : module;
  op(Opcode::kGlobal);
  out_ += written + "\n" + name + "\n";
  global_memo_[key] = memoize(nullptr);
}

void Protocol2Pickler::save_call(const Value& v) {
  if (v.kwargs) fail_internal("a call with keyword arguments needs protocol 4 (NEWOBJ_EX)");
  if (v.args && v.args->kind != Kind::kTuple) fail_internal("call arguments are not a tuple");
  save_ptr(v.callable);
  if (v.args) {
    save_ptr(v.args);
  } else {
    op(Opcode::kEmptyTuple);
  }
  op(v.newobj ? Opcode::kNewObj : Opcode::kReduce);
  memoize_or_fetch(&v, 1, false);
  batch_appends(v.items);
  batch_setitems(v.entries);
}

// pickle.py save_set / save_frozenset below protocol 4: set(list(items)).
void Protocol2Pickler::save_set(const Value& v) {
  save_global("builtins", v.kind == Kind::kSet ? "set" : "frozenset");
  op(Opcode::kEmptyList);
  memoize(nullptr);
  batch_appends(v.items);
  op(Opcode::kTuple1);
  memoize(nullptr);
  op(Opcode::kReduce);
  memoize_or_fetch(&v, 1, false);
}

void Protocol2Pickler::batch_appends(const std::vector<ValuePtr>& items) {
  for (std::size_t start = 0; start < items.size(); start += kBatchSize) {
    std::size_t end = std::min(items.size(), start + kBatchSize);
    if (end - start == 1) {
      save_ptr(items[start]);
      op(Opcode::kAppend);
      continue;
    }
    op(Opcode::kMark);
    for (std::size_t i = start; i < end; ++i) save_ptr(items[i]);
    op(Opcode::kAppends);
  }
}

void Protocol2Pickler::batch_setitems(const std::vector<std::pair<ValuePtr, ValuePtr>>& entries) {
  for (std::size_t start = 0; start < entries.size(); start += kBatchSize) {
    std::size_t end = std::min(entries.size(), start + kBatchSize);
    if (end - start == 1) {
      save_ptr(entries[start].first);
      save_ptr(entries[start].second);
      op(Opcode::kSetItem);
      continue;
    }
    op(Opcode::kMark);
    for (std::size_t i = start; i < end; ++i) {
      save_ptr(entries[i].first);
      save_ptr(entries[i].second);
    }
    op(Opcode::kSetItems);
  }
}

}  // namespace

std::string pickle_protocol2(const Value& root) {
  Protocol2Pickler pickler;
  return pickler.run(root);
}

}  // namespace ckpt::pickle
