// The decode table of docs/pickle-globals.md ("Framework objects as data"):
// each shape as numpy 1.x/2.x (numpy/_core/src/multiarray: arraydescr_reduce,
// array_reduce, gentype_reduce) and CPython (object.__reduce_ex__(2) of an
// argparse.Namespace, Enum.__reduce_ex__) pickle it, found with pickletools
// on numpy 2.4 / Python 3.11; what each becomes is what Python's own
// a.tolist(), dtype.str, s.item(), vars(ns), member.value give.
#include "pickle/framework_objects.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <unordered_map>

namespace ckpt::pickle {
namespace {

struct NumpyCode {
  std::string_view code;
  char kind;  // b i u f
  int size;
};
constexpr NumpyCode kNumpyCodes[] = {
    {"b1", 'b', 1}, {"i1", 'i', 1}, {"u1", 'u', 1}, {"i2", 'i', 2}, {"u2", 'u', 2}, {"i4", 'i', 4},
    {"u4", 'u', 4}, {"i8", 'i', 8}, {"u8", 'u', 8}, {"f2", 'f', 2}, {"f4", 'f', 4}, {"f8", 'f', 8},
};
constexpr std::size_t kMaxNumpyDims = 64;  // NPY_MAXDIMS (32 before numpy 2)

const NumpyCode* numpy_code(std::string_view code) {
  for (const NumpyCode& c : kNumpyCodes)
    if (c.code == code) return &c;
  return nullptr;
}

bool is_false(const Value& v) { return (v.is(Kind::kBool) && !v.bool_value) || (v.is(Kind::kInt) && v.int_value == 0); }
bool is_true(const Value& v) { return (v.is(Kind::kBool) && v.bool_value) || (v.is(Kind::kInt) && v.int_value == 1); }
bool is_int(const Value& v, int64_t n) { return v.is(Kind::kInt) && v.int_value == n; }

// A decoded dtype's code and byte order, from its str ('<u4').
struct Element {
  const NumpyCode* code;
  bool big_endian;
};
std::optional<Element> element_of(const Value& decoded_dtype) {
  if (!is_decoded_numpy_dtype(decoded_dtype) || decoded_dtype.text.size() < 2) return std::nullopt;
  const NumpyCode* c = numpy_code(std::string_view(decoded_dtype.text).substr(1));
  if (!c) return std::nullopt;
  return Element{c, decoded_dtype.text[0] == '>'};
}

// numel of `shape` (a tuple of ints >= 0, at most kMaxNumpyDims) times
// `size`; nullopt on a bad shape or overflow.
std::optional<uint64_t> byte_size(const Value& shape, int size) {
  if (!shape.is(Kind::kTuple) || shape.items.size() > kMaxNumpyDims) return std::nullopt;
  uint64_t n = static_cast<uint64_t>(size);
  for (const ValuePtr& d : shape.items) {
    if (!d->is(Kind::kInt) || d->int_value < 0) return std::nullopt;
    uint64_t dim = static_cast<uint64_t>(d->int_value);
    if (dim != 0 && n > UINT64_MAX / dim) return std::nullopt;
    n *= dim;
  }
  return n;
}

double half_to_double(uint16_t h) {
  int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double v;
  if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else if (exponent == 31) {
    v = mantissa ? std::nan("") : INFINITY;
  } else {
    v = std::ldexp(mantissa + 1024, exponent - 25);
  }
  return sign ? -v : v;
}

// One element at `p` as the Python number .item() gives.
ValuePtr element_value(const Element& e, const unsigned char* p) {
  uint64_t bits = 0;
  for (int i = 0; i < e.code->size; ++i) {
    int at = e.big_endian ? i : e.code->size - 1 - i;
    bits = (bits << 8) | p[at];
  }
  switch (e.code->kind) {
    case 'b': return Value::boolean(bits != 0);
    case 'i': {
      int shift = 64 - 8 * e.code->size;
      return Value::integer(static_cast<int64_t>(bits << shift) >> shift);
    }
    case 'u':
      if (bits > static_cast<uint64_t>(INT64_MAX)) {
        std::string le(9, '\0');
        for (int i = 0; i < 8; ++i) le[static_cast<std::size_t>(i)] = static_cast<char>((bits >> (8 * i)) & 0xff);
        return Value::big_integer(std::move(le));
      }
      return Value::integer(static_cast<int64_t>(bits));
    default: break;
  }
  if (e.code->size == 2) return Value::floating(half_to_double(static_cast<uint16_t>(bits)));
  if (e.code->size == 4) {
    float f;
    uint32_t b32 = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b32, 4);
    return Value::floating(f);
  }
  double d;
  std::memcpy(&d, &bits, 8);
  return Value::floating(d);
}

// A framework enum: Megatron's, under each module path the class has had
// (megatron/core/transformer/enums.py, megatron/core/enums.py; megatron-core
// 0.16, and ModelType.encoder_and_decoder = 2 of earlier releases).
struct FrameworkEnumMember {
  std::string_view module, cls, name;
  int64_t value;
};
constexpr std::string_view kMegatronEnums = "megatron.core.transformer.enums";
constexpr FrameworkEnumMember kFrameworkEnums[] = {
    {"megatron.core.enums", "ModelType", "encoder_or_decoder", 1},
    {"megatron.core.enums", "ModelType", "encoder_and_decoder", 2},
    {kMegatronEnums, "ModelType", "encoder_or_decoder", 1},
    {kMegatronEnums, "ModelType", "encoder_and_decoder", 2},
    {kMegatronEnums, "LayerType", "embedding", 1},
    {kMegatronEnums, "LayerType", "loss", 2},
    {kMegatronEnums, "LayerType", "encoder", 3},
    {kMegatronEnums, "LayerType", "decoder", 4},
    {kMegatronEnums, "LayerType", "mtp", 5},
    {kMegatronEnums, "AttnType", "self_attn", 1},
    {kMegatronEnums, "AttnType", "cross_attn", 2},
    {kMegatronEnums, "AttnMaskType", "padding", 1},
    {kMegatronEnums, "AttnMaskType", "causal", 2},
    {kMegatronEnums, "AttnMaskType", "no_mask", 3},
    {kMegatronEnums, "AttnMaskType", "padding_causal", 4},
    {kMegatronEnums, "AttnMaskType", "arbitrary", 5},
    {kMegatronEnums, "AttnMaskType", "causal_bottom_right", 6},
    {kMegatronEnums, "AttnBackend", "flash", 1},
    {kMegatronEnums, "AttnBackend", "fused", 2},
    {kMegatronEnums, "AttnBackend", "unfused", 3},
    {kMegatronEnums, "AttnBackend", "local", 4},
    {kMegatronEnums, "AttnBackend", "auto", 5},
    {kMegatronEnums, "CudaGraphScope", "full_iteration", 1},
    {kMegatronEnums, "CudaGraphScope", "attn", 2},
    {kMegatronEnums, "CudaGraphScope", "mlp", 3},
    {kMegatronEnums, "CudaGraphScope", "moe", 4},
    {kMegatronEnums, "CudaGraphScope", "moe_router", 5},
    {kMegatronEnums, "CudaGraphScope", "moe_preprocess", 6},
    {kMegatronEnums, "CudaGraphScope", "mamba", 7},
    // Megatron-LM's args.exit_signal (training_config.py: a signal.Signals,
    // SIGTERM by default) is in every legacy rank file; the catchable
    // signals a job may name, as Linux numbers them.
    {"signal", "Signals", "SIGHUP", 1},
    {"signal", "Signals", "SIGINT", 2},
    {"signal", "Signals", "SIGQUIT", 3},
    {"signal", "Signals", "SIGUSR1", 10},
    {"signal", "Signals", "SIGUSR2", 12},
    {"signal", "Signals", "SIGTERM", 15},
};

}  // namespace

bool is_numpy_multiarray(const Value& g, std::string_view name) {
  return g.is_global("numpy._core.multiarray", name) || g.is_global("numpy.core.multiarray", name);
}

bool numpy_reconstruct_args(const std::vector<ValuePtr>& a) {
  return a.size() == 3 && a[0]->is_global("numpy", "ndarray") && a[1]->is(Kind::kTuple) && a[1]->items.size() == 1 &&
         is_int(*a[1]->items[0], 0) && a[2]->is(Kind::kBytes) && a[2]->text == "b";
}

bool numpy_dtype_args(const std::vector<ValuePtr>& a) {
  return a.size() == 3 && a[0]->is(Kind::kStr) && numpy_code(a[0]->text) && is_false(*a[1]) && is_true(*a[2]);
}

bool numpy_dtype_state(const Value& call, const Value& state) {
  if (!call.is(Kind::kCall) || !call.args || !call.args->is(Kind::kTuple) || !numpy_dtype_args(call.args->items))
    return false;
  const NumpyCode* c = numpy_code(call.args->items[0]->text);
  if (!state.is(Kind::kTuple) || state.items.size() != 8) return false;
  const auto& s = state.items;
  if (!is_int(*s[0], 3) || !s[1]->is(Kind::kStr)) return false;
  const std::string& endian = s[1]->text;
  bool endian_ok = c->size == 1 ? endian == "|" : (endian == "<" || endian == ">");
  return endian_ok && s[2]->is(Kind::kNone) && s[3]->is(Kind::kNone) && s[4]->is(Kind::kNone) && is_int(*s[5], -1) &&
         is_int(*s[6], -1) && is_int(*s[7], 0);
}

bool is_decoded_numpy_dtype(const Value& v) {
  return v.is(Kind::kStr) && v.stored && v.stored->is(Kind::kBuilt) && v.stored->object &&
         v.stored->object->is(Kind::kCall) && v.stored->object->callable &&
         v.stored->object->callable->is_global("numpy", "dtype");
}

bool numpy_array_state(const Value& state) {
  if (!state.is(Kind::kTuple) || state.items.size() != 5) return false;
  const auto& s = state.items;
  auto e = element_of(*s[2]);
  if (!is_int(*s[0], 1) || !e || !s[3]->is(Kind::kBool) || !s[4]->is(Kind::kBytes)) return false;
  auto n = byte_size(*s[1], e->code->size);
  return n && *n == s[4]->text.size();
}

bool numpy_scalar_args(const std::vector<ValuePtr>& a) {
  if (a.size() != 2) return false;
  auto e = element_of(*a[0]);
  return e && a[1]->is(Kind::kBytes) && a[1]->text.size() == static_cast<std::size_t>(e->code->size);
}

bool is_namespace_class(const Value& g) { return g.is_global("argparse", "Namespace"); }

bool is_decoded_namespace(const Value& v) {
  return v.is(Kind::kDict) && v.stored && v.stored->is(Kind::kCall) && v.stored->newobj && v.stored->callable &&
         is_namespace_class(*v.stored->callable);
}

bool namespace_state(const Value& state) {
  return state.is(Kind::kDict) &&
         std::all_of(state.entries.begin(), state.entries.end(), [](const auto& e) { return e.first->is(Kind::kStr); });
}

bool framework_enum_class(const Value& g) {
  return std::any_of(std::begin(kFrameworkEnums), std::end(kFrameworkEnums),
                     [&](const FrameworkEnumMember& m) { return g.is_global(m.module, m.cls); });
}

std::optional<int64_t> framework_enum_member(const Value& cls, std::string_view name) {
  for (const FrameworkEnumMember& m : kFrameworkEnums)
    if (m.name == name && cls.is_global(m.module, m.cls)) return m.value;
  return std::nullopt;
}

std::optional<int64_t> framework_enum_value(const Value& callable, const std::vector<ValuePtr>& args) {
  if (callable.is_global("builtins", "getattr"))
    return args.size() == 2 && args[1]->is(Kind::kStr) ? framework_enum_member(*args[0], args[1]->text) : std::nullopt;
  if (args.size() != 1 || !args[0]->is(Kind::kInt)) return std::nullopt;
  for (const FrameworkEnumMember& m : kFrameworkEnums)
    if (m.value == args[0]->int_value && callable.is_global(m.module, m.cls)) return m.value;
  return std::nullopt;
}

namespace {

std::set<std::string, std::less<>>& opaque_globals() {
  static std::set<std::string, std::less<>> globals;
  return globals;
}

}  // namespace

void allow_opaque_global(const std::string& dotted) { opaque_globals().insert(dotted); }

bool is_opaque_global(std::string_view module, std::string_view name) {
  if (opaque_globals().empty()) return false;
  std::string dotted;
  dotted.reserve(module.size() + 1 + name.size());
  dotted.append(module).append(".").append(name);
  return opaque_globals().count(dotted) > 0;
}

bool is_opaque_global(const Value& g) { return g.is(Kind::kGlobal) && is_opaque_global(g.text, g.name); }

bool is_opaque_record(const Value& v) {
  return v.is(Kind::kDict) && v.stored && v.stored->is(Kind::kCall) && v.stored->callable &&
         is_opaque_global(*v.stored->callable);
}

std::string allow_global_hint(const std::string& dotted) {
  return " (if it is data, --allow-global " + dotted +
         " reads its calls as opaque records, never calling it: docs/pickle-globals.md)";
}

ValuePtr numpy_dtype_plain(const Value& call, const Value& state) {
  const std::string& code = call.args->items[0]->text;
  return Value::str(state.items[1]->text + code);
}

namespace {

// The nested lists of dimension `dim` on, C order; `offset` the element
// index of the first (Fortran or C strides in `strides`).
ValuePtr nested(const Element& e, const std::string& raw, const std::vector<uint64_t>& shape,
                const std::vector<uint64_t>& strides, std::size_t dim, uint64_t offset, const MakeValue& make) {
  if (dim == shape.size()) {
    const auto* p = reinterpret_cast<const unsigned char*>(raw.data()) + offset * static_cast<uint64_t>(e.code->size);
    return make(element_value(e, p));
  }
  std::vector<ValuePtr> items;
  items.reserve(shape[dim]);
  for (uint64_t i = 0; i < shape[dim]; ++i)
    items.push_back(nested(e, raw, shape, strides, dim + 1, offset + i * strides[dim], make));
  return make(Value::list(std::move(items)));
}

}  // namespace

ValuePtr numpy_array_plain(const Value& state, const MakeValue& make) {
  const auto& s = state.items;
  Element e = *element_of(*s[2]);
  std::vector<uint64_t> shape;
  for (const ValuePtr& d : s[1]->items) shape.push_back(static_cast<uint64_t>(d->int_value));
  const bool fortran = s[3]->bool_value;
  std::vector<uint64_t> strides(shape.size(), 1);
  if (fortran) {
    for (std::size_t k = 1; k < shape.size(); ++k) strides[k] = strides[k - 1] * shape[k - 1];
  } else {
    for (std::size_t k = shape.size(); k-- > 1;) strides[k - 1] = strides[k] * shape[k];
  }
  return nested(e, s[4]->text, shape, strides, 0, 0, make);
}

ValuePtr numpy_scalar_plain(const std::vector<ValuePtr>& a, const MakeValue& make) {
  Element e = *element_of(*a[0]);
  return make(element_value(e, reinterpret_cast<const unsigned char*>(a[1]->text.data())));
}

namespace {

// with_stored_objects over a graph whose nodes may be shared: each node is
// rebuilt once (memo), and a subtree without a BytesIO or a decoded
// framework object is returned as it is.
// Before, every level asked find_node of its whole subtree and copied shared
// subtrees once per path, so a value of 40 levels of [a, a] holding one
// BytesIO took 2^40 steps. Recursion is bounded by the unpickler's depth limit.
ValuePtr rebuild_bytes_io(const ValuePtr& value, std::unordered_map<const Value*, ValuePtr>& memo) {
  if (!value) return value;
  if (auto it = memo.find(value.get()); it != memo.end()) return it->second;
  ValuePtr out = value;
  if (value->stored) {
    // A decoded framework object: the object as stored (its parts may be
    // decoded ones too: an array's dtype). A Namespace's stored NEWOBJ is
    // built again with its attribute dict, rebuilt without the mark.
    if (is_decoded_namespace(*value)) {
      auto attributes = std::make_shared<Value>(*value);
      attributes->stored.reset();
      out = Value::built(value->stored, rebuild_bytes_io(attributes, memo));
    } else if (is_opaque_record(*value)) {
      // --allow-global: the call again, from the record's (decoded) parts.
      ValuePtr kwargs = value->get("kwargs");
      ValuePtr call = Value::call(value->stored->callable, rebuild_bytes_io(value->get("args"), memo),
                                  kwargs ? rebuild_bytes_io(kwargs, memo) : nullptr);
      call->newobj = value->stored->newobj;
      ValuePtr state = value->get("state");
      out = state ? Value::built(call, rebuild_bytes_io(state, memo)) : call;
    } else {
      out = rebuild_bytes_io(value->stored, memo);
    }
  } else if (value->is(Kind::kBytes)) {
    if (value->bytes_io) out = bytes_io_object(*value);
  } else {
    std::shared_ptr<Value> copy;  // made when the first child changes
    auto child = [&](const ValuePtr& old, auto&& slot_of) {
      ValuePtr now = rebuild_bytes_io(old, memo);
      if (now == old) return;
      if (!copy) copy = std::make_shared<Value>(*value);
      slot_of(*copy) = now;
    };
    for (std::size_t i = 0; i < value->items.size(); ++i)
      child(value->items[i], [i](Value& v) -> ValuePtr& { return v.items[i]; });
    for (std::size_t i = 0; i < value->entries.size(); ++i)
      child(value->entries[i].second, [i](Value& v) -> ValuePtr& { return v.entries[i].second; });
    child(value->object, [](Value& v) -> ValuePtr& { return v.object; });
    child(value->state, [](Value& v) -> ValuePtr& { return v.state; });
    child(value->args, [](Value& v) -> ValuePtr& { return v.args; });
    if (copy) out = copy;
  }
  memo.emplace(value.get(), out);
  return out;
}

}  // namespace

ValuePtr with_stored_objects(const ValuePtr& value) {
  std::unordered_map<const Value*, ValuePtr> memo;
  return rebuild_bytes_io(value, memo);
}

}  // namespace ckpt::pickle
