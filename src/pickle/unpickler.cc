// The pickle machine's loop, dispatch and binary opcodes. Opcode semantics
// follow CPython's Lib/pickle.py (_Unpickler.load_*) with two differences:
// nothing is imported or called (globals and calls become values), and every
// length, index and count is checked before anything is allocated for it.
#include <cstdio>
#include <cstring>

#include "core/budgets.h"
#include "core/error.h"
#include "core/units.h"
#include "pickle/encodings.h"
#include "pickle/opcodes.h"
#include "pickle/unpickler.h"
#include "pickle/unpickler_machine.h"

namespace ckpt::pickle {

PickleMachine::PickleMachine(std::string_view bytes, const GlobalPolicy& policy, const UnpickleLimits& limits)
    : bytes_(bytes), policy_(policy), limits_(limits) {
  if (!limits_.max_bytes) limits_.max_bytes = pickle_memory_budget(bytes.size());
  if (!limits_.max_stack) limits_.max_stack = input_budgets().pickle_stack;
}

PickleMachine::~PickleMachine() {
  if (!finished_) cut_children({});
}

// ---- reading ----

std::string_view PickleMachine::read_bytes(uint64_t n) {
  uint64_t left = bytes_.size() - pos_;
  if (n > left) {
    fail_data_loss("needs " + std::to_string(n) + " bytes but only " + std::to_string(left) + " remain");
  }
  std::string_view out = bytes_.substr(pos_, n);
  pos_ += n;
  return out;
}

uint64_t PickleMachine::read_le(int n) {
  std::string_view b = read_bytes(n);
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(b[i])} << (8 * i);
  return v;
}

double PickleMachine::read_f64_be() {
  std::string_view b = read_bytes(8);
  uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(b[i]);
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

std::string_view PickleMachine::read_line() {
  std::size_t nl = bytes_.find('\n', pos_);
  if (nl == std::string_view::npos) fail_data_loss("text argument has no terminating newline");
  std::string_view line = bytes_.substr(pos_, nl - pos_);
  pos_ = nl + 1;
  return line;
}

uint64_t PickleMachine::read_length(int n, bool is_signed) {
  uint64_t len = read_le(n);
  if (is_signed && n == 4 && static_cast<int32_t>(static_cast<uint32_t>(len)) < 0) {
    fail_data_loss("negative length prefix");
  }
  uint64_t left = bytes_.size() - pos_;
  if (len > left) {
    fail_data_loss("length prefix " + std::to_string(len) + " exceeds the " + std::to_string(left) +
                   " bytes that remain");
  }
  return len;
}

// ---- stack, marks, memo ----

ValuePtr PickleMachine::make(ValuePtr v) {
  if (++values_ > limits_.max_total_values) {
    fail_data_loss("pickle creates more than " + std::to_string(limits_.max_total_values) + " values");
  }
  // None, bools and small ints are shared constants: they cost a stack or
  // container slot, nothing more.
  if (!Value::is_constant(*v)) {
    charge(kValueCost + v->text.size() + v->items.size() * kSlotCost + v->entries.size() * 2 * kSlotCost);
  }
  if (holds_values(v->kind)) arena_.push_back(v);
  return v;
}

// The decoded values, containers and memo count against the pickle-memory
// budget, the stack against its own (real stacks stay in the thousands);
// either exceeded is Unsafe naming it, before the allocation it would cost.
void PickleMachine::charge(uint64_t bytes) {
  charged_ += bytes;
  if (charged_ + stack_.size() * kSlotCost > limits_.max_bytes) {
    fail(ErrorCode::kUnsafe, "decoding the pickle takes more than " + human_bytes(double(limits_.max_bytes)) +
                                 " (the pickle-memory budget for " + human_bytes(double(bytes_.size())) +
                                 " of pickle; " + budget_hint("pickle-memory") + ")");
  }
}

void PickleMachine::push(ValuePtr v) {
  if (stack_.size() >= limits_.max_stack) {
    fail(ErrorCode::kUnsafe, "the pickle stack holds more than " + std::to_string(limits_.max_stack) +
                                 " values (the pickle-stack budget; " + budget_hint("pickle-stack") + ")");
  }
  stack_.push_back(std::move(v));
}

ValuePtr PickleMachine::pop() {
  if (stack_.size() <= frame_base()) fail_data_loss("stack underflow");
  ValuePtr v = std::move(stack_.back());
  stack_.pop_back();
  return v;
}

const ValuePtr& PickleMachine::top() const {
  if (stack_.size() <= frame_base()) fail_data_loss("stack underflow");
  return stack_.back();
}

void PickleMachine::push_mark() {
  if (marks_.size() >= limits_.max_depth) {
    fail_data_loss("more than " + std::to_string(limits_.max_depth) + " nested marks");
  }
  marks_.push_back(stack_.size());
}

std::vector<ValuePtr> PickleMachine::pop_mark() {
  if (marks_.empty()) fail_data_loss("no mark on the stack");
  std::size_t base = marks_.back();
  marks_.pop_back();
  std::vector<ValuePtr> items(std::make_move_iterator(stack_.begin() + base), std::make_move_iterator(stack_.end()));
  stack_.resize(base);
  return items;
}

void PickleMachine::memo_put(uint64_t index) {
  if (index >= limits_.max_memo) {
    fail_data_loss("memo index " + std::to_string(index) + " is beyond the memo limit of " +
                   std::to_string(limits_.max_memo));
  }
  auto [it, fresh] = memo_.try_emplace(index);
  if (fresh) charge(kMemoCost);
  it->second = top();
}

void PickleMachine::memo_get(uint64_t index) {
  auto it = memo_.find(index);
  if (it == memo_.end()) fail_data_loss("memo index " + std::to_string(index) + " was never stored");
  push(it->second);
}

void PickleMachine::check_container_size(uint64_t n) const {
  if (n > limits_.max_container) {
    fail_data_loss("container of more than " + std::to_string(limits_.max_container) + " elements");
  }
}

// ---- small binary opcodes ----

void PickleMachine::op_pop() {
  if (stack_.size() > frame_base()) {
    stack_.pop_back();
  } else {
    pop_mark();
  }
}

void PickleMachine::op_proto() {
  proto_ = static_cast<int>(read_le(1));
  if (proto_ > 5) {
    fail(ErrorCode::kUnimplemented, "pickle protocol " + std::to_string(proto_) + " is newer than 5");
  }
}

// A frame (protocol 4+) only groups opcodes for buffered reading; its
// length must fit in what remains.
void PickleMachine::op_frame() { read_length(8, false); }

void PickleMachine::op_long_bytes(uint64_t n) {
  std::string_view le = read_bytes(n);
  if (auto v = twos_complement_to_int64(le)) {
    push_new(Value::integer(*v));
  } else {
    push_new(Value::big_integer(std::string(le)));
  }
}

void PickleMachine::op_unicode_bytes(uint64_t n) {
  std::string_view text = read_bytes(n);
  if (!is_valid_utf8(text)) fail_data_loss("string is not valid UTF-8");
  push_new(Value::str(std::string(text)));
}

[[noreturn]] static void refuse_unresolvable(const char* what) {
  fail(ErrorCode::kUnimplemented, std::string(what) + ", which cannot be resolved offline");
}

bool PickleMachine::step(uint8_t op) {
  switch (static_cast<Opcode>(op)) {
    // stack and marks
    case Opcode::kMark: push_mark(); break;
    case Opcode::kStop: return false;
    case Opcode::kPop: op_pop(); break;
    case Opcode::kPopMark: pop_mark(); break;
    case Opcode::kDup: push(top()); break;
    // scalars
    case Opcode::kNone: push_new(Value::none()); break;
    case Opcode::kNewTrue: push_new(Value::boolean(true)); break;
    case Opcode::kNewFalse: push_new(Value::boolean(false)); break;
    case Opcode::kBinInt: push_new(Value::integer(read_i32())); break;
    case Opcode::kBinInt1: push_new(Value::integer(static_cast<int64_t>(read_le(1)))); break;
    case Opcode::kBinInt2: push_new(Value::integer(static_cast<int64_t>(read_le(2)))); break;
    case Opcode::kLong1: op_long_bytes(read_length(1, false)); break;
    case Opcode::kLong4: op_long_bytes(read_length(4, true)); break;
    case Opcode::kBinFloat: push_new(Value::floating(read_f64_be())); break;
    case Opcode::kInt: op_int(); break;
    case Opcode::kLong: op_long(); break;
    case Opcode::kFloat: op_float(); break;
    // strings and bytes
    case Opcode::kString: op_string(); break;
    case Opcode::kBinString: op_py2_string(read_bytes(read_length(4, true))); break;
    case Opcode::kShortBinString: op_py2_string(read_bytes(read_length(1, false))); break;
    case Opcode::kUnicode: op_unicode(); break;
    case Opcode::kShortBinUnicode: op_unicode_bytes(read_length(1, false)); break;
    case Opcode::kBinUnicode: op_unicode_bytes(read_length(4, false)); break;
    case Opcode::kBinUnicode8: op_unicode_bytes(read_length(8, false)); break;
    case Opcode::kShortBinBytes: push_new(Value::bytes(std::string(read_bytes(read_length(1, false))))); break;
    case Opcode::kBinBytes: push_new(Value::bytes(std::string(read_bytes(read_length(4, false))))); break;
    case Opcode::kBinBytes8: push_new(Value::bytes(std::string(read_bytes(read_length(8, false))))); break;
    case Opcode::kByteArray8: {
      auto v = Value::bytes(std::string(read_bytes(read_length(8, false))));
      v->bytearray = true;
      push_new(std::move(v));
      break;
    }
    // containers
    case Opcode::kEmptyTuple: push_new(Value::tuple({})); break;
    case Opcode::kEmptyList: push_new(Value::list({})); break;
    case Opcode::kEmptyDict: push_new(Value::dict()); break;
    case Opcode::kEmptySet: push_new(std::make_shared<Value>(Kind::kSet)); break;
    case Opcode::kTuple1: op_tuple_n(1); break;
    case Opcode::kTuple2: op_tuple_n(2); break;
    case Opcode::kTuple3: op_tuple_n(3); break;
    case Opcode::kTuple: op_collection(Kind::kTuple); break;
    case Opcode::kList: op_collection(Kind::kList); break;
    case Opcode::kFrozenSet: op_collection(Kind::kFrozenSet); break;
    case Opcode::kDict: op_dict(); break;
    case Opcode::kAppend: op_append(); break;
    case Opcode::kAppends: op_appends(); break;
    case Opcode::kSetItem: op_setitem(); break;
    case Opcode::kSetItems: op_setitems(); break;
    case Opcode::kAddItems: op_additems(); break;
    // globals, calls, objects
    case Opcode::kGlobal: op_global(); break;
    case Opcode::kStackGlobal: op_stack_global(); break;
    case Opcode::kInst: op_inst(); break;
    case Opcode::kObj: op_obj(); break;
    case Opcode::kReduce: op_reduce(); break;
    case Opcode::kNewObj: op_newobj(); break;
    case Opcode::kNewObjEx: op_newobj_ex(); break;
    case Opcode::kBuild: op_build(); break;
    case Opcode::kPersId: op_persid(); break;
    case Opcode::kBinPersId: push_new(Value::persistent_id(pop())); break;
    // memo
    case Opcode::kGet: op_get(); break;
    case Opcode::kBinGet: memo_get(read_le(1)); break;
    case Opcode::kLongBinGet: memo_get(read_le(4)); break;
    case Opcode::kPut: op_put(); break;
    case Opcode::kBinPut: memo_put(read_le(1)); break;
    case Opcode::kLongBinPut: memo_put(read_le(4)); break;
    case Opcode::kMemoize: memo_put(memo_.size()); break;
    // framing and protocol
    case Opcode::kProto: op_proto(); break;
    case Opcode::kFrame: op_frame(); break;
    // what an offline reader cannot resolve
    case Opcode::kExt1:
    case Opcode::kExt2:
    case Opcode::kExt4: refuse_unresolvable("it names an object through the copyreg extension registry");
    case Opcode::kNextBuffer:
    case Opcode::kReadOnlyBuffer: refuse_unresolvable("it uses an out-of-band buffer");
    default: {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", op);
      fail_data_loss(std::string("unknown opcode ") + hex);
    }
  }
  return true;
}

namespace {
std::string where(uint8_t op, std::size_t offset) {
  const char* name = opcode_name(op);
  return std::string("pickle opcode ") + (name ? name : "?") + " at byte " + std::to_string(offset);
}
}  // namespace

ValuePtr PickleMachine::run() {
  while (true) {
    if (pos_ >= bytes_.size()) {
      fail_data_loss("pickle ends at byte " + std::to_string(pos_) + " without a STOP opcode");
    }
    op_pos_ = pos_;
    auto op = static_cast<uint8_t>(bytes_[pos_++]);
    try {
      if (!step(op)) break;
    } catch (const Error& e) {
      throw Error(e.code(), where(op, op_pos_) + ": " + e.message());
    }
  }
  ValuePtr result;
  try {
    result = pop();
  } catch (const Error& e) {
    throw Error(e.code(), where(static_cast<uint8_t>(Opcode::kStop), op_pos_) + ": " + e.message());
  }
  auto reached = check_graph(result.get());
  cut_children(reached);
  finished_ = true;
  return result;
}

ValuePtr unpickle(std::string_view bytes, const GlobalPolicy& policy, const UnpickleLimits& limits) {
  PickleMachine machine(bytes, policy, limits);
  return machine.run();
}

ValuePtr unpickle(const ByteSource& source, const GlobalPolicy& policy, const UnpickleLimits& limits) {
  return with_context(source.describe(), [&] {
    if (const std::byte* data = source.data()) {
      return unpickle(std::string_view(reinterpret_cast<const char*>(data), source.size()), policy, limits);
    }
    std::string bytes = source.read_string(0, source.size());
    return unpickle(bytes, policy, limits);
  });
}

}  // namespace ckpt::pickle
