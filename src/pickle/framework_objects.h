// Framework objects a training job saves beside its model, decoded as data
// (docs/pickle-globals.md, "Framework objects as data"): numpy arrays,
// dtypes and scalars (np.random.get_state(), Megatron-LM's rng_state), an
// argparse.Namespace (Megatron-LM's args) and Megatron's enums. Nothing is
// imported or called: each class is accepted in exactly the pickle shape
// numpy / CPython write for it (checked by the policy when the stream makes
// the call or BUILD), and the unpickler then replaces the object by its
// plain value, keeping the object as made in Value::stored:
//
//   ndarray  -> what a.tolist() returns (nested lists of int/float/bool; a
//               0-d array its one number), decoded from the stored bytes
//   dtype    -> its str: '<u4', '|b1', '>f8'
//   scalar   -> what s.item() returns: int, float or bool
//   Namespace-> its attribute dict, vars(ns)
//   enum     -> its value (an int)
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pickle/value.h"

namespace ckpt::pickle {

// numpy.core.multiarray.NAME or numpy._core.multiarray.NAME (numpy < 2 / >= 2).
bool is_numpy_multiarray(const Value& g, std::string_view name);

// ---- shapes (asked by the policy) ----
// _reconstruct(numpy.ndarray, (0,), b'b')
bool numpy_reconstruct_args(const std::vector<ValuePtr>& a);
// numpy.dtype(code, False, True) for a code of the table (b1, i1-i8, u1-u8, f2-f8)
bool numpy_dtype_args(const std::vector<ValuePtr>& a);
// BUILD state of such a dtype: (3, endian, None, None, None, -1, -1, 0); '|' for 1-byte codes, '<' / '>' otherwise
bool numpy_dtype_state(const Value& call, const Value& state);
// BUILD state of _reconstruct's array: (1, shape, dtype, is_fortran, raw bytes of shape's size)
bool numpy_array_state(const Value& state);
// scalar(dtype, raw bytes of the dtype's size)
bool numpy_scalar_args(const std::vector<ValuePtr>& a);
// A dtype the unpickler decoded (a str whose `stored` is numpy.dtype(...) built).
bool is_decoded_numpy_dtype(const Value& v);

// argparse.Namespace: NEWOBJ with no arguments; BUILD with a dict of str keys.
bool is_namespace_class(const Value& g);
bool is_decoded_namespace(const Value& v);
bool namespace_state(const Value& state);

// An enum member of the framework enums table (Megatron's), called as
// EnumClass(value) or looked up as getattr(EnumClass, 'NAME'): its value;
// nullopt for anything else. framework_enum_class: the class is in the table.
bool framework_enum_class(const Value& g);
std::optional<int64_t> framework_enum_value(const Value& callable, const std::vector<ValuePtr>& args);
// The (class, name, value) rows, for enum_member_value's getattr form.
std::optional<int64_t> framework_enum_member(const Value& cls, std::string_view name);

// ---- --allow-global MODULE.NAME: opaque records ----
// Globals the user allowed (process-wide, set once from the command line
// before anything is read). Their calls (REDUCE, NEWOBJ, NEWOBJ_EX, INST,
// OBJ; any arguments) and BUILDs on what those made are read as an opaque
// record, a dict {'__global__': 'MODULE.NAME', 'args': (...)[, 'kwargs':
// {...}][, 'state': ...]}: never called, and written into outputs torch.load
// reads as that dict, never as a callable. DCP outputs write the object as
// stored again (with_stored_objects), as for the decode table.
void allow_opaque_global(const std::string& dotted);
bool is_opaque_global(std::string_view module, std::string_view name);
bool is_opaque_global(const Value& g);
// A record the unpickler made of an allowed global's call.
bool is_opaque_record(const Value& v);
// The hint refusals of an unknown global give.
std::string allow_global_hint(const std::string& dotted);

// ---- plain values (made by the unpickler once the shape was accepted) ----
// `make` counts each new node against the unpickler's budgets.
using MakeValue = std::function<ValuePtr(ValuePtr)>;
// The dtype's str for numpy.dtype(code, ...) built with `state`.
ValuePtr numpy_dtype_plain(const Value& call, const Value& state);
ValuePtr numpy_array_plain(const Value& state, const MakeValue& make);
ValuePtr numpy_scalar_plain(const std::vector<ValuePtr>& a, const MakeValue& make);

// `value` with every `bytes_io` kBytes under it made a BytesIO object again,
// and every value the unpickler decoded from a framework object (`stored`)
// that object again (the same node when there is none): what a DCP item
// writes, so that dcp.load hands the job back what it saved.
ValuePtr with_stored_objects(const ValuePtr& value);

}  // namespace ckpt::pickle
