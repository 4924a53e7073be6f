// What an unpickled stream may name and do. The unpickler never imports or
// calls anything, but the value tree it builds is interpreted by decoders and
// written again into outputs, which torch then loads with the real pickle
// machine. So a policy decides not only which globals a stream may name but
// also how it may use them: a stream naming os.system, or reaching eval
// through an allowed builtins.getattr, is refused (Unsafe, exit 3) instead of
// being decoded as if it were a checkpoint and passed on.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "pickle/value.h"

namespace ckpt::pickle {

// How the stream invokes a callable. REDUCE, INST and OBJ call
// `callable(*args)`; NEWOBJ and NEWOBJ_EX call `cls.__new__(cls, *args)`.
enum class CallOp { kCall, kNew };

class GlobalPolicy {
 public:
  virtual ~GlobalPolicy() = default;
  virtual bool allows(std::string_view module, std::string_view name) const = 0;
  // Throws Unsafe naming the call when the stream calls something in a way
  // no checkpoint does. `args` is the argument tuple; `kwargs` may be null.
  virtual void check_call(const Value& callable, const Value& args, const Value* kwargs, CallOp op) const = 0;
  // Throws Unsafe when BUILD (`__setstate__` or a `__dict__` update) targets
  // something no checkpoint builds, e.g. a class or a function.
  virtual void check_build(const Value& target, const Value& state) const = 0;
  // Throws Unsafe when APPENDS / SETITEMS would call `extend`, `append` or
  // `__setitem__` on something other than a plain list, dict or set.
  virtual void check_fill(const Value& target) const = 0;
};

// The value of an allow-listed enum's member `name` of class `cls` (a
// global); nullopt when that class has no such member.
std::optional<int64_t> enum_member_value(const Value& cls, std::string_view name);
// The value of an enum member as a stream makes it: EnumClass(value), or
// getattr(EnumClass, 'NAME') as Python 3.11 pickles it; nullopt for
// anything else.
std::optional<int64_t> enum_value(const Value& v);

// Everything a torch.save checkpoint, a DCP .metadata or a per-rank FSDP file
// legitimately names and does (docs/pickle-globals.md): tensor rebuild
// functions with their argument shapes, storage classes, dtypes,
// torch.Size/device, OrderedDict, ShardedTensor/DTensor and their metadata,
// DCP metadata classes, pathlib paths, and the one getattr torch emits
// (ShardedTensor.ProcessGroupState).
const GlobalPolicy& checkpoint_policy();

// For files whose entries a reader may drop (DeepSpeed's client_state, which
// a training script fills with its own objects: an argparse.Namespace, a
// config class). A global `base` does not allow is not refused at once: it
// becomes an inert (module, name) record, and so do calls, BUILDs and fills
// whose target is such a record. Nothing is ever called either way. Every
// other use is checked by `base`, so the getattr chains and rebuild shapes
// it refuses stay refused. The reader must then refuse or drop every entry
// that holds one (first_quarantined_global) before using the tree.
class QuarantinePolicy final : public GlobalPolicy {
 public:
  explicit QuarantinePolicy(const GlobalPolicy& base) : base_(base) {}
  bool allows(std::string_view, std::string_view) const override { return true; }
  void check_call(const Value& callable, const Value& args, const Value* kwargs, CallOp op) const override;
  void check_build(const Value& target, const Value& state) const override;
  void check_fill(const Value& target) const override;

 private:
  bool quarantined(const Value& v) const;
  const GlobalPolicy& base_;
};

// "module.name" of the first global under `root` (find_node: every part of
// every node, each node once) that `known` refuses; empty when there is none.
std::string first_quarantined_global(const Value& root,
                                     const std::function<bool(std::string_view, std::string_view)>& known);

}  // namespace ckpt::pickle
