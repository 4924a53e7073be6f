// Globals, calls, BUILD and the container opcodes of the pickle machine.
// A global is only a (module, name) value after the policy allowed it; a call
// only records callable and arguments, except a few built-in constructors of
// plain data that are folded into the value they would make (see fold_call).
#include "core/error.h"
#include "pickle/encodings.h"
#include "pickle/framework_objects.h"
#include "pickle/unpickler_machine.h"

namespace ckpt::pickle {
namespace {

// Python 2 module names that CPython maps for protocol < 3 (fix_imports;
// Lib/_compat_pickle.py IMPORT_MAPPING, the entries a checkpoint can hit).
void fix_import(std::string& module) {
  if (module == "__builtin__")
    module = "builtins";
  else if (module == "copy_reg")
    module = "copyreg";
}

bool is_latin1_codec(const ValuePtr& v) {
  if (!v || v->kind != Kind::kStr) return false;
  const std::string& s = v->text;
  return s == "latin1" || s == "latin-1" || s == "latin_1" || s == "iso-8859-1" || s == "iso8859-1";
}

bool is_empty_tuple(const ValuePtr& v) { return v && v->kind == Kind::kTuple && v->items.empty(); }

}  // namespace

void PickleMachine::check_global(const std::string& module, const std::string& name) const {
  if (!policy_.allows(module, name)) {
    fail(ErrorCode::kUnsafe, "global '" + module + "." + name +
                                 "' is not one a checkpoint needs; refusing to load a pickle that names it" +
                                 allow_global_hint(module + "." + name));
  }
}

ValuePtr PickleMachine::make_global(std::string module, std::string name) {
  if (!is_valid_utf8(module) || !is_valid_utf8(name)) fail_data_loss("global name is not valid UTF-8");
  if (proto_ < 3) fix_import(module);
  check_global(module, name);
  return make(Value::global(std::move(module), std::move(name)));
}

void PickleMachine::op_global() {
  std::string module(read_line());
  std::string name(read_line());
  push(make_global(std::move(module), std::move(name)));
}

void PickleMachine::op_stack_global() {
  ValuePtr name = pop();
  ValuePtr module = pop();
  if (module->kind != Kind::kStr || name->kind != Kind::kStr) {
    fail_data_loss(std::string("STACK_GLOBAL needs two str, found ") + kind_name(module->kind) + " and " +
                   kind_name(name->kind));
  }
  push(make_global(module->text, name->text));
}

// INST: module and class as text lines, arguments down to the top mark.
void PickleMachine::op_inst() {
  std::string module(read_line());
  std::string name(read_line());
  ValuePtr cls = make_global(std::move(module), std::move(name));
  ValuePtr args = make(Value::tuple(pop_mark()));
  policy_.check_call(*cls, *args, nullptr, CallOp::kCall);
  push(opaque_or_call(make(Value::call(std::move(cls), std::move(args)))));
}

// OBJ: class and arguments down to the top mark.
void PickleMachine::op_obj() {
  std::vector<ValuePtr> items = pop_mark();
  if (items.empty()) fail_data_loss("OBJ without a class");
  ValuePtr cls = std::move(items.front());
  items.erase(items.begin());
  ValuePtr args = make(Value::tuple(std::move(items)));
  policy_.check_call(*cls, *args, nullptr, CallOp::kCall);
  push(opaque_or_call(make(Value::call(std::move(cls), std::move(args)))));
}

// The built-in constructors of plain data become that data: OrderedDict()
// (filled by the SETITEMS that follow), set/frozenset(list), bytearray and
// bytes (protocol < 3 pickles bytes as _codecs.encode(latin-1 str, 'latin1')).
// nullptr when the call is anything else.
ValuePtr PickleMachine::fold_call(const ValuePtr& callable, const ValuePtr& args) const {
  if (callable->kind != Kind::kGlobal || !args || args->kind != Kind::kTuple) return nullptr;
  const auto& a = args->items;
  const Value& g = *callable;
  if (g.is_global("collections", "OrderedDict") && a.empty()) return Value::dict({}, true);
  bool is_set = g.is_global("builtins", "set");
  if (is_set || g.is_global("builtins", "frozenset")) {
    auto out = std::make_shared<Value>(is_set ? Kind::kSet : Kind::kFrozenSet);
    Kind from = a.empty() ? Kind::kNone : a[0]->kind;
    if (a.size() == 1 &&
        (from == Kind::kList || from == Kind::kTuple || from == Kind::kSet || from == Kind::kFrozenSet)) {
      out->items = a[0]->items;
    } else if (!a.empty()) {
      return nullptr;
    }
    return out;
  }
  bool is_bytearray = g.is_global("builtins", "bytearray");
  if (is_bytearray || g.is_global("builtins", "bytes") || g.is_global("_codecs", "encode")) {
    ValuePtr out;
    if (a.empty() && !g.is_global("_codecs", "encode")) {
      out = Value::bytes("");
    } else if (a.size() == 1 && a[0]->kind == Kind::kBytes && !g.is_global("_codecs", "encode")) {
      out = Value::bytes(a[0]->text);
    } else if (a.size() == 2 && a[0]->kind == Kind::kStr && is_latin1_codec(a[1])) {
      out = Value::bytes(utf8_to_latin1(a[0]->text));
    } else {
      return nullptr;
    }
    out->bytearray = is_bytearray;
    return out;
  }
  return nullptr;
}

void PickleMachine::op_reduce() {
  ValuePtr args = pop();
  ValuePtr callable = pop();
  if (ValuePtr folded = fold_call(callable, args)) {
    push_new(std::move(folded));
  } else {
    policy_.check_call(*callable, *args, nullptr, CallOp::kCall);
    if (ValuePtr plain = fold_framework_call(callable, args)) {
      push(std::move(plain));
      return;
    }
    push(opaque_or_call(make(Value::call(std::move(callable), std::move(args)))));
  }
}

ValuePtr PickleMachine::fold_framework_call(const ValuePtr& callable, const ValuePtr& args) {
  if (!callable->is(Kind::kGlobal) || !args->is(Kind::kTuple)) return nullptr;
  ValuePtr plain;
  MakeValue counted = [this](ValuePtr v) { return make(std::move(v)); };
  if (is_numpy_multiarray(*callable, "scalar") && numpy_scalar_args(args->items)) {
    plain = numpy_scalar_plain(args->items, counted);
  } else if (auto n = framework_enum_value(*callable, args->items)) {
    plain = Value::integer(*n);
  } else {
    return nullptr;
  }
  // A fresh node (small ints and bools are shared constants): it carries
  // the call as the pickle made it.
  ValuePtr out = make(std::make_shared<Value>(*plain));
  out->stored = make(Value::call(callable, args));
  arena_.push_back(out);
  return out;
}

// A call of a global allowed by --allow-global: the opaque record
// {'__global__': 'MODULE.NAME', 'args': args[, 'kwargs': kwargs]}, the call
// kept as stored. Any other call as it is.
ValuePtr PickleMachine::opaque_or_call(const ValuePtr& call) {
  if (!call->callable || !is_opaque_global(*call->callable)) return call;
  ValuePtr record = make(Value::dict());
  std::vector<ValuePtr> flat = {make(Value::str("__global__")),
                                make(Value::str(call->callable->text + "." + call->callable->name)),
                                make(Value::str("args")), call->args};
  if (call->kwargs) {
    flat.push_back(make(Value::str("kwargs")));
    flat.push_back(call->kwargs);
  }
  add_entries(record, std::move(flat));
  record->stored = call;
  return record;
}

bool PickleMachine::fold_framework_build(const ValuePtr& target, const ValuePtr& state) {
  if (is_opaque_record(*target)) {
    // BUILD (__setstate__ or a __dict__ update): recorded as 'state', the last one kept.
    for (auto& [key, value] : target->entries)
      if (key->is(Kind::kStr) && key->text == "state") {
        value = state;
        return true;
      }
    add_entries(target, {make(Value::str("state")), state});
    return true;
  }
  if (is_decoded_namespace(*target)) {
    std::vector<ValuePtr> flat;
    for (const auto& [key, value] : state->entries) {
      flat.push_back(key);
      flat.push_back(value);
    }
    add_entries(target, std::move(flat));
    return true;
  }
  if (!target->is(Kind::kCall) || !target->callable) return false;
  const bool array = is_numpy_multiarray(*target->callable, "_reconstruct");
  if (!array && !target->callable->is_global("numpy", "dtype")) return false;
  MakeValue counted = [this](ValuePtr v) { return make(std::move(v)); };
  ValuePtr plain = array ? numpy_array_plain(*state, counted) : make(numpy_dtype_plain(*target, *state));
  ValuePtr object = make(std::make_shared<Value>(std::move(*target)));
  ValuePtr stored = make(Value::built(std::move(object), state));
  *target = Value(*plain);
  target->stored = std::move(stored);
  return true;
}

void PickleMachine::op_newobj() {
  ValuePtr args = pop();
  ValuePtr cls = pop();
  if (cls->is_global("collections", "OrderedDict") && is_empty_tuple(args)) {
    push_new(Value::dict({}, true));
    return;
  }
  policy_.check_call(*cls, *args, nullptr, CallOp::kNew);
  ValuePtr v = Value::call(std::move(cls), std::move(args));
  v->newobj = true;
  if (is_namespace_class(*v->callable)) {
    // argparse.Namespace(): its attribute dict, empty until BUILD.
    ValuePtr attributes = make(Value::dict());
    attributes->stored = make(std::move(v));
    push(std::move(attributes));
    return;
  }
  push(opaque_or_call(make(std::move(v))));
}

void PickleMachine::op_newobj_ex() {
  ValuePtr kwargs = pop();
  ValuePtr args = pop();
  ValuePtr cls = pop();
  policy_.check_call(*cls, *args, kwargs.get(), CallOp::kNew);
  ValuePtr v = Value::call(std::move(cls), std::move(args), std::move(kwargs));
  v->newobj = true;
  push(opaque_or_call(make(std::move(v))));
}

// BUILD changes the object in place in Python, and the memo or a container
// may already hold it; so the node itself becomes the kBuilt and its former
// content moves into a new node, its `object`.
void PickleMachine::op_build() {
  ValuePtr state = pop();
  const ValuePtr& target = top();
  if (target->is(Kind::kCall) && target->newobj && target->callable->is_global("_io", "BytesIO")) {
    fold_bytes_io(*target, *state);
    return;
  }
  // Python cannot BUILD a scalar either (no __dict__, no __setstate__); and
  // None, bools and small ints are shared constants here, never rewritten.
  if (!holds_values(target->kind) && target->kind != Kind::kGlobal) {
    fail_data_loss(std::string("BUILD on a ") + kind_name(target->kind));
  }
  policy_.check_build(*target, *state);
  if (fold_framework_build(target, state)) return;
  bool registered = holds_values(target->kind);
  ValuePtr object = make(std::make_shared<Value>(std::move(*target)));
  *target = Value(Kind::kBuilt);
  target->object = std::move(object);
  target->state = std::move(state);
  if (!registered) arena_.push_back(target);
}

// An io.BytesIO is data (DCP stores a job's BytesIO state this way: torch.save
// of the object): io.BytesIO.__reduce_ex__(2) is NEWOBJ(BytesIO, ()) and
// BUILD (getvalue(), tell(), __dict__ or None). The node becomes those bytes,
// flagged, in place (the memo may hold it already). Any other shape is
// refused: a BytesIO with attributes or arguments is not a checkpoint's.
void PickleMachine::fold_bytes_io(Value& target, const Value& state) {
  const auto* s = state.is(Kind::kTuple) ? &state.items : nullptr;
  bool plain = target.args && target.args->is(Kind::kTuple) && target.args->items.empty() && !target.kwargs &&
               target.items.empty() && target.entries.empty();
  bool shape = s && s->size() == 3 && (*s)[0]->is(Kind::kBytes) && (*s)[1]->is(Kind::kInt) && (*s)[1]->int_value >= 0 &&
               ((*s)[2]->is(Kind::kNone) || ((*s)[2]->is(Kind::kDict) && (*s)[2]->entries.empty()));
  if (!plain || !shape)
    fail(ErrorCode::kUnsafe, "the pickle builds an io.BytesIO from " + state.repr(2, 4) +
                                 ", not the (bytes, position, None) a saved BytesIO holds; refusing to load it");
  std::string bytes = (*s)[0]->text;
  int64_t position = (*s)[1]->int_value;
  target = Value(Kind::kBytes);
  target.text = std::move(bytes);
  target.bytes_io = true;
  target.int_value = position;
}

void PickleMachine::add_items(Value& target, std::vector<ValuePtr> values) {
  if (target.kind == Kind::kCall || target.kind == Kind::kBuilt) {
    policy_.check_fill(target);
  } else if (target.kind != Kind::kList) {
    fail_data_loss(std::string("cannot append to a ") + kind_name(target.kind));
  }
  check_container_size(uint64_t{target.items.size()} + values.size());
  charge(values.size() * kSlotCost);
  for (auto& v : values) target.items.push_back(std::move(v));
}

namespace {

// What Python's TypeError would name: the class of an object, else the kind.
std::string type_name(const Value& v) {
  const Value* call = v.is(Kind::kBuilt) ? v.object.get() : &v;
  if (call && call->is(Kind::kCall) && call->callable && call->callable->is(Kind::kGlobal)) return call->callable->name;
  return kind_name(v.kind);
}

}  // namespace

void PickleMachine::add_entries(const ValuePtr& target_ptr, std::vector<ValuePtr> flat) {
  Value& target = *target_ptr;
  if (target.kind == Kind::kCall || target.kind == Kind::kBuilt) {
    policy_.check_fill(target);
  } else if (target.kind != Kind::kDict) {
    fail_data_loss(std::string("cannot set items of a ") + kind_name(target.kind));
  }
  if (flat.size() % 2 != 0) fail_data_loss("odd number of items for key/value pairs");
  check_container_size(uint64_t{target.entries.size()} + flat.size() / 2);
  charge(flat.size() * kSlotCost);
  if (target.kind != Kind::kDict) {  // an object's __setitem__ (checked by the policy): kept as given
    for (std::size_t i = 0; i < flat.size(); i += 2)
      target.entries.emplace_back(std::move(flat[i]), std::move(flat[i + 1]));
    return;
  }
  // A dict as Python builds it: an unhashable key is the TypeError
  // pickle.load raises; a repeated key keeps its first place and takes the
  // last value (a damaged memo index can make either out of a valid pickle).
  // Every identity made is charged, kept or not: what makes and compares
  // keys is bounded by the budget, not only what a dict holds.
  auto identity = [&](const Value& key) {
    const uint64_t left = limits_.max_bytes > charged_ ? limits_.max_bytes - charged_ : 0;
    auto id = dict_key_identity(key, static_cast<std::size_t>(std::min<uint64_t>(left, SIZE_MAX)));
    if (!id)
      fail_data_loss("a dict key of an unhashable type (" + type_name(key) +
                     "): Python's unpickler refuses it (TypeError)");
    charge(id->size());
    return std::move(*id);
  };
  for (std::size_t i = 0; i < flat.size(); i += 2) {
    std::string id = identity(*flat[i]);
    std::optional<std::size_t> found;
    auto indexed = key_index_.find(&target);
    if (indexed != key_index_.end()) {
      if (auto it = indexed->second.at.find(id); it != indexed->second.at.end()) found = it->second;
    } else {
      for (std::size_t e = 0; e < target.entries.size() && !found; ++e)
        if (identity(*target.entries[e].first) == id) found = e;
    }
    if (found) {
      target.entries[*found].second = std::move(flat[i + 1]);
      continue;
    }
    target.entries.emplace_back(std::move(flat[i]), std::move(flat[i + 1]));
    if (indexed != key_index_.end()) {
      charge(kSlotCost);
      indexed->second.at.emplace(std::move(id), target.entries.size() - 1);
    } else if (target.entries.size() > kIndexedDict) {
      KeyIndex& index = key_index_[&target];
      index.dict = target_ptr;
      for (std::size_t e = 0; e < target.entries.size(); ++e) {
        std::string key = identity(*target.entries[e].first);
        charge(kSlotCost);
        index.at.emplace(std::move(key), e);
      }
    }
  }
}

namespace {

// APPENDS / SETITEMS on a decoded framework object (a Namespace's dict, an
// array's list) would call the object's methods in Python: refused like on
// any other object.
void refuse_fill_of_decoded(const Value& target) {
  if (!target.stored) return;
  const Value* made = target.stored.get();
  if (made->is(Kind::kBuilt) && made->object) made = made->object.get();
  std::string what = made->is(Kind::kCall) && made->callable && made->callable->is(Kind::kGlobal)
                         ? made->callable->text + "." + made->callable->name
                         : kind_name(made->kind);
  fail(ErrorCode::kUnsafe, "the pickle adds items to the " + what +
                               " object (APPENDS/SETITEMS on an object calls its methods), which a checkpoint never "
                               "does; refusing to load it");
}

}  // namespace

void PickleMachine::op_append() {
  ValuePtr v = pop();
  refuse_fill_of_decoded(*top());
  add_items(*top(), {std::move(v)});
}

void PickleMachine::op_appends() {
  std::vector<ValuePtr> values = pop_mark();
  refuse_fill_of_decoded(*top());
  add_items(*top(), std::move(values));
}

void PickleMachine::op_setitem() {
  ValuePtr value = pop();
  ValuePtr key = pop();
  refuse_fill_of_decoded(*top());
  add_entries(top(), {std::move(key), std::move(value)});
}

void PickleMachine::op_setitems() {
  std::vector<ValuePtr> flat = pop_mark();
  refuse_fill_of_decoded(*top());
  add_entries(top(), std::move(flat));
}

void PickleMachine::op_additems() {
  std::vector<ValuePtr> values = pop_mark();
  Value& target = *top();
  if (target.kind != Kind::kSet) fail_data_loss(std::string("cannot add items to a ") + kind_name(target.kind));
  check_container_size(uint64_t{target.items.size()} + values.size());
  charge(values.size() * kSlotCost);
  for (auto& v : values) target.items.push_back(std::move(v));
}

void PickleMachine::op_dict() {
  std::vector<ValuePtr> flat = pop_mark();
  ValuePtr d = make(Value::dict());
  push(d);
  add_entries(d, std::move(flat));
}

void PickleMachine::op_tuple_n(std::size_t n) {
  if (stack_.size() - frame_base() < n) fail_data_loss("stack underflow");
  std::vector<ValuePtr> items(std::make_move_iterator(stack_.end() - n), std::make_move_iterator(stack_.end()));
  stack_.resize(stack_.size() - n);
  push_new(Value::tuple(std::move(items)));
}

void PickleMachine::op_collection(Kind kind) {
  std::vector<ValuePtr> items = pop_mark();
  check_container_size(items.size());
  auto v = std::make_shared<Value>(kind);
  v->items = std::move(items);
  push_new(std::move(v));
}

}  // namespace ckpt::pickle
