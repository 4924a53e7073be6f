// Internal to the unpickler: the pickle virtual machine (stack, marks, memo)
// split over unpickler.cc (loop, dispatch, binary reads), unpickler_ops.cc
// (globals, calls, containers), unpickler_text.cc (protocol-0 text opcodes)
// and unpickler_graph.cc (final checks of the value graph, teardown).
//
// Lifetime: every value that can hold other values is also kept in `arena_`
// until the machine ends. Nothing the stream builds is destroyed while it
// runs, and at the end the machine cuts the children of every value the
// result does not reach (or of all of them after an error). So a cycle, or a
// chain nested a million deep that the result never shows, is taken apart
// iteratively here instead of leaking or overflowing the C++ stack in
// recursive shared_ptr destructors. The result itself is checked to be
// acyclic and at most limits.max_depth deep.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pickle/policy.h"
#include "pickle/unpickle_limits.h"
#include "pickle/value.h"

namespace ckpt::pickle {

class PickleMachine {
 public:
  PickleMachine(std::string_view bytes, const GlobalPolicy& policy, const UnpickleLimits& limits);
  ~PickleMachine();
  PickleMachine(const PickleMachine&) = delete;
  PickleMachine& operator=(const PickleMachine&) = delete;

  // Runs to STOP; the value STOP pops.
  ValuePtr run();

 private:
  // ---- reading (unpickler.cc) ----
  uint64_t read_le(int n);
  int32_t read_i32() { return static_cast<int32_t>(static_cast<uint32_t>(read_le(4))); }
  double read_f64_be();
  std::string_view read_bytes(uint64_t n);
  std::string_view read_line();
  // Reads an n-byte length prefix, checked against the bytes that remain.
  uint64_t read_length(int n, bool is_signed);

  // ---- stack, marks, memo (unpickler.cc) ----
  ValuePtr make(ValuePtr v);  // counts a fresh value, registers containers
  void push(ValuePtr v);
  void push_new(ValuePtr v) { push(make(std::move(v))); }
  ValuePtr pop();
  const ValuePtr& top() const;
  std::size_t frame_base() const { return marks_.empty() ? 0 : marks_.back(); }
  void push_mark();
  std::vector<ValuePtr> pop_mark();
  void memo_put(uint64_t index);
  void memo_get(uint64_t index);
  void check_container_size(uint64_t n) const;
  // Counts `bytes` of decoded memory against limits.max_bytes.
  void charge(uint64_t bytes);
  // What the count charges: one heap value (Value + shared_ptr control
  // block), one slot in a container or on the stack, one memo entry.
  static constexpr uint64_t kValueCost = sizeof(Value) + 16;
  static constexpr uint64_t kSlotCost = sizeof(ValuePtr);
  static constexpr uint64_t kMemoCost = 64;

  bool step(uint8_t op);  // false at STOP
  void op_pop();
  void op_proto();
  void op_frame();
  void op_long_bytes(uint64_t n);
  void op_unicode_bytes(uint64_t n);

  // ---- objects and containers (unpickler_ops.cc) ----
  void check_global(const std::string& module, const std::string& name) const;
  ValuePtr make_global(std::string module, std::string name);
  void op_global();
  void op_stack_global();
  void op_inst();
  void op_obj();
  void op_reduce();
  void op_newobj();
  void op_newobj_ex();
  void op_build();
  void op_append();
  void op_appends();
  void op_setitem();
  void op_setitems();
  void op_additems();
  void op_dict();
  void op_tuple_n(std::size_t n);
  void op_collection(Kind kind);  // LIST / TUPLE / FROZENSET from the top mark
  ValuePtr fold_call(const ValuePtr& callable, const ValuePtr& args) const;
  void fold_bytes_io(Value& target, const Value& state);
  // Framework objects (framework_objects.h), once the policy accepted their
  // shape: a numpy scalar or enum member call becomes its plain value (null
  // for any other call); BUILD of a numpy array or dtype replaces the
  // object in place, of a decoded Namespace adds its attributes (false for
  // any other BUILD).
  ValuePtr fold_framework_call(const ValuePtr& callable, const ValuePtr& args);
  bool fold_framework_build(const ValuePtr& target, const ValuePtr& state);
  ValuePtr opaque_or_call(const ValuePtr& call);
  void add_items(Value& target, std::vector<ValuePtr> values);
  void add_entries(const ValuePtr& target, std::vector<ValuePtr> flat);

  // ---- protocol-0 text opcodes (unpickler_text.cc) ----
  void op_int();
  void op_long();
  void op_float();
  void op_string();
  void op_py2_string(std::string_view raw);  // STRING / BINSTRING / SHORT_BINSTRING
  void op_unicode();
  void op_persid();
  void op_get();
  void op_put();

  // ---- final checks and teardown (unpickler_graph.cc) ----
  // Container -> containers nested in it, itself included.
  using Heights = std::unordered_map<const Value*, uint64_t>;
  // Throws DataLoss when `root` reaches a cycle or nests deeper than allowed;
  // returns the height of every container it reaches.
  Heights check_graph(const Value* root) const;
  // Cuts the children of every arena value not in `keep`.
  void cut_children(const Heights& keep);

  std::string_view bytes_;
  std::size_t pos_ = 0;
  std::size_t op_pos_ = 0;
  int proto_ = 0;
  const GlobalPolicy& policy_;
  UnpickleLimits limits_;
  std::vector<ValuePtr> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
  // Per dict past kIndexedDict entries: key identity -> entry (the dict is
  // held, so its address is not reused while the index lives).
  struct KeyIndex {
    ValuePtr dict;
    std::unordered_map<std::string, std::size_t> at;
  };
  std::unordered_map<const Value*, KeyIndex> key_index_;
  static constexpr std::size_t kIndexedDict = 16;
  std::vector<ValuePtr> arena_;
  uint64_t values_ = 0;
  uint64_t charged_ = 0;  // bytes counted by charge()
  bool finished_ = false;
};

// True for kinds that can hold other values.
bool holds_values(Kind kind);

}  // namespace ckpt::pickle
