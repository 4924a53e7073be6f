// The neutral value tree an unpickled object becomes. Nothing here executes:
// a global is just a (module, name) pair, a call just records callable and
// arguments, BUILD just records object and state. Format decoders
// (formats/*) interpret the shapes they know.
//
// Values are shared (the pickle memo can reference one object many times)
// and mutable only while the unpickler builds them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckpt::pickle {

enum class Kind {
  kNone,
  kBool,
  kInt,     // fits in int64
  kBigInt,  // LONG1/LONG4 beyond int64: `text` holds two's complement little-endian bytes
  kFloat,
  kStr,    // UTF-8 in `text`
  kBytes,  // raw bytes in `text` (BINBYTES, SHORT_BINBYTES, BYTEARRAY8: `bytearray` flag)
  kTuple,
  kList,
  kDict,  // `entries`, insertion order kept, any key kind; `ordered` for collections.OrderedDict()
  kSet,
  kFrozenSet,
  kGlobal,  // `text` = module, `name` = qualified name
  kCall,    // REDUCE / NEWOBJ / NEWOBJ_EX / INST / OBJ: `callable(*args, **kwargs)`
  kBuilt,   // BUILD: `object` with `state` applied
  kPersId,  // BINPERSID / PERSID: `pid`
};

const char* kind_name(Kind kind);

class Value;
using ValuePtr = std::shared_ptr<Value>;

class Value {
 public:
  explicit Value(Kind k) : kind(k) {}

  Kind kind;
  bool bool_value = false;
  int64_t int_value = 0;
  double float_value = 0.0;
  bool bytearray = false;  // kBytes came from BYTEARRAY8 / bytearray()
  // kBytes was an io.BytesIO (NEWOBJ + BUILD (bytes, position, None)); its
  // position is in int_value. Outputs torch.load(weights_only=True) reads
  // hold the bytes; DCP outputs make it a BytesIO again (bytes_io_object).
  bool bytes_io = false;
  bool ordered = false;  // kDict is a collections.OrderedDict
  bool newobj = false;   // kCall came from NEWOBJ/NEWOBJ_EX (cls.__new__), not REDUCE
  std::string text;
  std::string name;
  std::vector<ValuePtr> items;                         // tuple/list/set elements; APPENDS onto a kCall/kBuilt
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;  // dict entries; SETITEMS onto a kCall/kBuilt
  ValuePtr callable, args, kwargs;                     // kCall (kwargs may be null)
  ValuePtr object, state;                              // kBuilt
  ValuePtr pid;                                        // kPersId
  // The object the pickle made, where the unpickler decoded a framework
  // object into this plain value (docs/pickle-globals.md, "Framework
  // objects as data": a numpy array, dtype or scalar, an enum member, an
  // argparse.Namespace). Walks of the tree (find_node, inspect, writers)
  // never look here; outputs that keep what was stored (DCP items, through
  // with_stored_objects (pickle/framework_objects.h)) write it instead of the plain value. It is the
  // whole object, except for a Namespace, whose plain value is its
  // attribute dict: there it is the NEWOBJ call alone, built again with
  // that dict.
  ValuePtr stored;

  // ---- construction ----
  static ValuePtr none();
  static ValuePtr boolean(bool v);
  static ValuePtr integer(int64_t v);
  static ValuePtr big_integer(std::string le_twos_complement);
  static ValuePtr floating(double v);
  static ValuePtr str(std::string v);
  static ValuePtr bytes(std::string v);
  static ValuePtr tuple(std::vector<ValuePtr> items);
  static ValuePtr list(std::vector<ValuePtr> items);
  static ValuePtr dict(std::vector<std::pair<ValuePtr, ValuePtr>> entries = {}, bool ordered = false);
  static ValuePtr global(std::string module, std::string name);
  static ValuePtr call(ValuePtr callable, ValuePtr args, ValuePtr kwargs = nullptr);
  static ValuePtr built(ValuePtr object, ValuePtr state);
  static ValuePtr persistent_id(ValuePtr pid);

  // None, True, False and the ints in [kMinConstantInt, kMaxConstantInt] are
  // shared constants: the constructors return one node for each, so a
  // pickle of millions of them allocates nothing per value. Never mutated.
  static constexpr int64_t kMinConstantInt = -256;
  static constexpr int64_t kMaxConstantInt = 1023;
  static bool is_constant(const Value& v);

  // ---- inspection (throw DataLoss naming the expected kind on mismatch) ----
  bool is(Kind k) const { return kind == k; }
  bool is_global(std::string_view module, std::string_view qualname) const;
  int64_t as_int() const;
  double as_number() const;  // int or float
  bool as_bool() const;
  const std::string& as_str() const;
  const std::string& as_bytes() const;
  // Elements of a tuple or list.
  const std::vector<ValuePtr>& as_sequence() const;
  // dict lookup by string key; nullptr when absent (DataLoss if not a dict).
  ValuePtr get(std::string_view key) const;
  // Like get, DataLoss naming `key` when absent.
  ValuePtr at(std::string_view key) const;

  // Short Python-like rendering for messages and inspect, bounded in depth
  // and length: "{'lr': 0.01, 'params': [...]}".
  std::string repr(int max_depth = 3, std::size_t max_items = 8) const;
};

// What Python's dict compares a key by, or nullopt for a value Python cannot
// hash (a list, dict, set, bytearray, a tuple holding one, or an object of a
// class whose instances are unhashable: OrderedDict, the dataclasses of DCP
// metadata). Equal keys give equal strings: 1, 1.0 and True are one key, as
// in Python; other objects compare by identity. A torch.load of a pickle
// with an unhashable key raises TypeError, and a repeated key keeps its
// first place with the last value: the unpickler does the same. Unsafe
// (naming the pickle-memory budget) when the string would pass `max_size`.
std::optional<std::string> dict_key_identity(const Value& key, std::size_t max_size);

// The io.BytesIO a kBytes with `bytes_io` was, as torch.save pickles one
// (_io.BytesIO NEWOBJ, then BUILD with (bytes, position, None)); DCP
// loaders hand it back to the job's load_state_dict, which may seek it.
ValuePtr bytes_io_object(const Value& bytes);

// The first node under `root` (root included, in any part of any node:
// items, keys, values, callables, arguments, states, persistent ids) for
// which `match` is true, or null. Iterative and memoised by node, so a
// shared or deep subtree costs its size once, whatever the pickle made.
// The non-const form lets a caller that visits every node (match returning
// false) change what it finds: the one walk of a tree, for both.
const Value* find_node(const Value& root, const std::function<bool(const Value&)>& match);
Value* find_node(Value& root, const std::function<bool(Value&)>& match);

}  // namespace ckpt::pickle
