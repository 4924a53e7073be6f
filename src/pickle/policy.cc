// The checkpoint policy: exact (module, name) pairs, each with the one way a
// checkpoint uses it, and for callables the argument shapes torch emits. Each
// group says where it was seen; docs/pickle-globals.md lists which file kinds
// name which global (found by pickletools on checkpoints written with torch
// 2.15 / Python 3.11, plus older module paths) and how each is used. Module
// names are as the unpickler reports them: protocol < 3 `__builtin__` already
// mapped to `builtins`, as CPython does.
//
// Why shapes and not just names: torch loads our outputs, and users load our
// inputs, with the real pickle machine. An allowed name used in an unexpected
// way is a way to run code there: getattr(getattr(getattr, '__self__'),
// 'eval'), _rebuild_from_type_v2(getattr, ...), BUILD on a class. So every
// call, BUILD and APPENDS/SETITEMS is checked against the shapes below when
// the stream makes it, and anything else is refused naming it.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "pickle/framework_objects.h"
#include "pickle/policy.h"

namespace ckpt::pickle {

namespace {

// The allow-listed enums' members, under every module path the class has
// had: torch 1.13-2.15 (torch/distributed/_shard/sharded_tensor/metadata.py,
// torch/distributed/checkpoint/metadata.py) and DeepSpeed
// (deepspeed/runtime/zero/config.py; max_stage is an alias of weights).
struct EnumMember {
  std::string_view module, cls, name;
  int64_t value;
};
constexpr EnumMember kEnumMembers[] = {
    {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING", "TORCH_CONTIGUOUS_FORMAT", 0},
    {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING", "TORCH_CHANNELS_LAST", 1},
    {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING", "TORCH_PRESERVE_FORMAT", 2},
    {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", "TORCH_CONTIGUOUS_FORMAT", 0},
    {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", "TORCH_CHANNELS_LAST", 1},
    {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", "TORCH_PRESERVE_FORMAT", 2},
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", "disabled", 0},
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", "optimizer_states", 1},
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", "gradients", 2},
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", "weights", 3},
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", "max_stage", 3},
};

}  // namespace

std::optional<int64_t> enum_member_value(const Value& cls, std::string_view name) {
  for (const EnumMember& m : kEnumMembers)
    if (m.name == name && cls.is_global(m.module, m.cls)) return m.value;
  return std::nullopt;
}

std::optional<int64_t> enum_value(const Value& v) {
  if (!v.is(Kind::kCall) || !v.callable || !v.args || !v.args->is(Kind::kTuple)) return std::nullopt;
  const auto& a = v.args->items;
  if (v.callable->is_global("builtins", "getattr"))
    return a.size() == 2 && a[1]->is(Kind::kStr) ? enum_member_value(*a[0], a[1]->text) : std::nullopt;
  bool enum_class = std::any_of(std::begin(kEnumMembers), std::end(kEnumMembers),
                                [&](const EnumMember& m) { return v.callable->is_global(m.module, m.cls); });
  if (enum_class && a.size() == 1 && a[0]->is(Kind::kInt)) return a[0]->int_value;
  return std::nullopt;
}

namespace {

// kValue: only ever appears as a value (dtypes, storage classes, layouts,
//   tensor classes, the rebuild function _rebuild_from_type_v2 is given);
//   never called, never built.
// kNew: a class instantiated by NEWOBJ (cls.__new__, no __init__) and filled
//   by BUILD (dataclasses, NamedTuples, placements, metadata records).
// kCall: a function or class called by REDUCE with the arguments `args`
//   accepts; nullptr accepts none: the unpickler folds its plain-data forms
//   (OrderedDict(), set(list), bytes) before the policy is asked.
enum class Use { kValue, kNew, kCall };
using ArgsCheck = bool (*)(const std::vector<ValuePtr>& args);

struct Entry {
  std::string_view module;
  std::string_view name;
  Use use;
  ArgsCheck args = nullptr;
};

bool is_number(const ValuePtr& v) { return v->is(Kind::kInt) || v->is(Kind::kFloat) || v->is(Kind::kBool); }
bool is_torch_value_global(const Value& v);
bool is_tensor_class(const Value& v);
bool call_accepted(const Value& callable, const std::vector<ValuePtr>& args);

bool one_str(const std::vector<ValuePtr>& a) { return a.size() == 1 && a[0]->is(Kind::kStr); }
bool one_int(const std::vector<ValuePtr>& a) { return a.size() == 1 && a[0]->is(Kind::kInt); }
bool all_str(const std::vector<ValuePtr>& a) {
  return std::all_of(a.begin(), a.end(), [](const ValuePtr& v) { return v->is(Kind::kStr); });
}
bool complex_args(const std::vector<ValuePtr>& a) {
  return (a.size() == 1 || a.size() == 2) && std::all_of(a.begin(), a.end(), is_number);
}
// torch.Size((d0, d1, ...))
bool size_args(const std::vector<ValuePtr>& a) {
  if (a.size() != 1 || !(a[0]->is(Kind::kTuple) || a[0]->is(Kind::kList))) return false;
  return std::all_of(a[0]->items.begin(), a[0]->items.end(), [](const ValuePtr& v) { return v->is(Kind::kInt); });
}
// torch.device('cuda'), torch.device('cuda', 0)
bool device_args(const std::vector<ValuePtr>& a) {
  return (a.size() == 1 || a.size() == 2) && a[0]->is(Kind::kStr) && (a.size() == 1 || a[1]->is(Kind::kInt));
}
// getattr(ShardedTensor, 'ProcessGroupState'): how protocol 2 names the
// nested class ShardedTensor.ProcessGroupState.
bool process_group_state_lookup(const std::vector<ValuePtr>& a) {
  return a.size() == 2 && a[0]->is_global("torch.distributed._shard.sharded_tensor.api", "ShardedTensor") &&
         a[1]->is(Kind::kStr) && a[1]->text == "ProcessGroupState";
}
// getattr(EnumClass, 'NAME'): an enum member as some Pythons pickle it
// (Enum.__reduce_ex__; Debian 12's Python 3.11.2 does, for torch 1.13's
// MEM_FORMAT_ENCODING), where others call EnumClass(value). Only the
// allow-listed enums, each by a name it has.
bool enum_member_lookup(const std::vector<ValuePtr>& a) {
  return a.size() == 2 && a[1]->is(Kind::kStr) && enum_member_value(*a[0], a[1]->text).has_value();
}
// getattr(EnumClass, 'NAME') for a framework enum (Megatron's): decoded as its value.
bool framework_enum_lookup(const std::vector<ValuePtr>& a) {
  return a.size() == 2 && a[1]->is(Kind::kStr) && framework_enum_member(*a[0], a[1]->text).has_value();
}
bool getattr_args(const std::vector<ValuePtr>& a) {
  return process_group_state_lookup(a) || enum_member_lookup(a) || framework_enum_lookup(a);
}
// _rebuild_tensor(storage, storage_offset, size, stride)
// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
// _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])
// The storage is always a persistent id (torch.save never pickles storage bytes inline).
bool rebuild_tensor_args(const std::vector<ValuePtr>& a) { return a.size() == 4 && a[0]->is(Kind::kPersId); }
bool rebuild_tensor_v2_args(const std::vector<ValuePtr>& a) {
  return (a.size() == 6 || a.size() == 7) && a[0]->is(Kind::kPersId);
}
bool rebuild_tensor_v3_args(const std::vector<ValuePtr>& a) {
  return (a.size() == 7 || a.size() == 8) && a[0]->is(Kind::kPersId) && is_torch_value_global(*a[6]);
}
// A tensor argument: what a tensor rebuild call made.
bool is_tensor_call(const ValuePtr& v) {
  return v->is(Kind::kCall) && v->callable->is(Kind::kGlobal) && v->callable->text.rfind("torch._", 0) == 0 &&
         v->callable->name.rfind("_rebuild_", 0) == 0;
}
// _rebuild_parameter(data, requires_grad, backward_hooks)
// _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state)
bool rebuild_parameter_args(const std::vector<ValuePtr>& a) {
  return a.size() == 3 && is_tensor_call(a[0]) && a[1]->is(Kind::kBool);
}
bool rebuild_parameter_with_state_args(const std::vector<ValuePtr>& a) {
  return a.size() == 4 && is_tensor_call(a[0]) && a[1]->is(Kind::kBool);
}
// _rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device, requires_grad)
bool rebuild_wrapper_subclass_args(const std::vector<ValuePtr>& a) {
  return a.size() == 8 && is_tensor_class(*a[0]) && is_torch_value_global(*a[1]);
}
// _rebuild_from_type_v2(func, new_type, args, state) calls func(*args): func
// must be a tensor rebuild called with its own shape, new_type a tensor class.
bool rebuild_from_type_args(const std::vector<ValuePtr>& a) {
  if (a.size() != 4 || !a[0]->is(Kind::kGlobal) || !is_tensor_class(*a[1]) || !a[2]->is(Kind::kTuple)) return false;
  if (a[0]->is_global("torch._utils", "_rebuild_wrapper_subclass")) return rebuild_wrapper_subclass_args(a[2]->items);
  bool tensor_rebuild =
      a[0]->is_global("torch._utils", "_rebuild_tensor_v2") || a[0]->is_global("torch._utils", "_rebuild_tensor_v3");
  return tensor_rebuild && call_accepted(*a[0], a[2]->items);
}

constexpr Entry kAllowed[] = {
    // ---- plain data that protocol-2 pickles through constructors ----
    // OrderedDict state dicts and _rebuild_tensor_v2's backward hooks.
    {"collections", "OrderedDict", Use::kCall, nullptr},
    // bytes at protocol < 3 (_codecs.encode(latin-1 str, 'latin1')), sets,
    // bytearray, empty bytes, complex scalars.
    {"_codecs", "encode", Use::kCall, nullptr},
    {"builtins", "set", Use::kCall, nullptr},
    {"builtins", "frozenset", Use::kCall, nullptr},
    {"builtins", "bytearray", Use::kCall, nullptr},
    {"builtins", "bytes", Use::kCall, nullptr},
    {"builtins", "complex", Use::kCall, &complex_args},
    // io.BytesIO: a DCP item saved from a BytesIO value (torchtitan's
    // train_state); folded into its bytes when BUILD gives its state.
    {"_io", "BytesIO", Use::kNew},
    // getattr(ShardedTensor, 'ProcessGroupState') in ShardedTensor state,
    // getattr(EnumClass, 'NAME') for an allow-listed enum's member.
    {"builtins", "getattr", Use::kCall, &getattr_args},

    // ---- torch.save tensors (torch/_utils.py, torch/_tensor.py) ----
    {"torch._utils", "_rebuild_tensor", Use::kCall, &rebuild_tensor_args},  // files of torch 0.4-1.x
    {"torch._utils", "_rebuild_tensor_v2", Use::kCall, &rebuild_tensor_v2_args},
    // float8, uint16/32/64 with UntypedStorage
    {"torch._utils", "_rebuild_tensor_v3", Use::kCall, &rebuild_tensor_v3_args},
    {"torch._utils", "_rebuild_parameter", Use::kCall, &rebuild_parameter_args},
    {"torch._utils", "_rebuild_parameter_with_state", Use::kCall, &rebuild_parameter_with_state_args},
    {"torch._utils", "_rebuild_wrapper_subclass", Use::kValue},  // ShardedTensor, DTensor
    {"torch._tensor", "_rebuild_from_type_v2", Use::kCall, &rebuild_from_type_args},
    {"torch", "Tensor", Use::kValue},
    {"torch.nn.parameter", "Parameter", Use::kValue},
    {"torch", "Size", Use::kCall, &size_args},
    {"torch", "device", Use::kCall, &device_args},
    // layouts pickle as _get_layout('torch.strided'); older files name them
    {"torch.serialization", "_get_layout", Use::kCall, &one_str},
    {"torch", "strided", Use::kValue},
    {"torch", "sparse_coo", Use::kValue},
    {"torch", "sparse_csr", Use::kValue},
    // memory formats pickle by name
    {"torch", "contiguous_format", Use::kValue},
    {"torch", "channels_last", Use::kValue},
    {"torch", "channels_last_3d", Use::kValue},
    {"torch", "preserve_format", Use::kValue},

    // ---- storage classes (torch._storage_classes; data.pkl persistent ids) ----
    {"torch", "DoubleStorage", Use::kValue},
    {"torch", "FloatStorage", Use::kValue},
    {"torch", "HalfStorage", Use::kValue},
    {"torch", "BFloat16Storage", Use::kValue},
    {"torch", "LongStorage", Use::kValue},
    {"torch", "IntStorage", Use::kValue},
    {"torch", "ShortStorage", Use::kValue},
    {"torch", "CharStorage", Use::kValue},
    {"torch", "ByteStorage", Use::kValue},
    {"torch", "BoolStorage", Use::kValue},
    {"torch", "ComplexDoubleStorage", Use::kValue},
    {"torch", "ComplexFloatStorage", Use::kValue},
    {"torch", "QUInt8Storage", Use::kValue},
    {"torch", "QInt8Storage", Use::kValue},
    {"torch", "QInt32Storage", Use::kValue},
    {"torch", "QUInt4x2Storage", Use::kValue},
    {"torch", "QUInt2x4Storage", Use::kValue},
    {"torch", "UntypedStorage", Use::kValue},
    {"torch.storage", "UntypedStorage", Use::kValue},  // as torch 2.x pickles it
    {"torch.storage", "TypedStorage", Use::kValue},

    // ---- ShardedTensor (torch/distributed/_shard; per-rank FSDP files) ----
    {"torch.distributed._shard.sharded_tensor.api", "ShardedTensor", Use::kValue},
    {"torch.distributed._shard.sharded_tensor.shard", "Shard", Use::kNew},
    {"torch.distributed._shard.metadata", "ShardMetadata", Use::kNew},
    {"torch.distributed._shard.sharded_tensor.metadata", "ShardedTensorMetadata", Use::kNew},
    {"torch.distributed._shard.sharded_tensor.metadata", "TensorProperties", Use::kNew},  // also DCP <= 2.2
    {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING", Use::kCall, &one_int},
    {"torch.distributed._shard.sharding_spec.chunk_sharding_spec", "ChunkShardingSpec", Use::kNew},
    {"torch.distributed._shard.sharding_spec.api", "EnumerableShardingSpec", Use::kNew},
    {"torch.distributed.remote_device", "_remote_device", Use::kNew},

    // ---- DTensor (torch/distributed/tensor; torch 2.15 paths) ----
    {"torch.distributed.tensor", "DTensor", Use::kValue},
    {"torch.distributed.tensor._dtensor_spec", "DTensorSpec", Use::kNew},
    {"torch.distributed.tensor._dtensor_spec", "TensorMeta", Use::kNew},
    {"torch.distributed.tensor._dtensor_spec", "ShardOrderEntry", Use::kNew},
    {"torch.distributed.tensor.placement_types", "Shard", Use::kNew},
    {"torch.distributed.tensor.placement_types", "Replicate", Use::kNew},
    {"torch.distributed.tensor.placement_types", "Partial", Use::kNew},
    {"torch.distributed.tensor.placement_types", "_Partial", Use::kNew},
    {"torch.distributed.tensor.placement_types", "_StridedShard", Use::kNew},
    {"torch.distributed.device_mesh", "DeviceMesh", Use::kNew},
    {"torch.distributed._mesh_layout", "_MeshLayout", Use::kNew},
    {"torch.distributed._mesh_layout", "_FlatLayout", Use::kNew},
    // ---- DTensor, older torch (torch.distributed._tensor, <= 2.4) ----
    {"torch.distributed._tensor.api", "DTensor", Use::kValue},
    {"torch.distributed._tensor.placement_types", "Shard", Use::kNew},
    {"torch.distributed._tensor.placement_types", "Replicate", Use::kNew},
    {"torch.distributed._tensor.placement_types", "Partial", Use::kNew},
    {"torch.distributed._tensor.placement_types", "_Partial", Use::kNew},
    {"torch.distributed._tensor.placement_types", "_StridedShard", Use::kNew},
    {"torch.distributed._tensor.placement_types", "DTensorSpec", Use::kNew},
    {"torch.distributed._tensor.placement_types", "TensorMeta", Use::kNew},
    {"torch.distributed._tensor._dtensor_spec", "DTensorSpec", Use::kNew},
    {"torch.distributed._tensor._dtensor_spec", "TensorMeta", Use::kNew},
    {"torch.distributed._tensor.device_mesh", "DeviceMesh", Use::kNew},

    // ---- DCP .metadata (torch/distributed/checkpoint/{metadata,filesystem}.py) ----
    {"torch.distributed.checkpoint.metadata", "Metadata", Use::kNew},
    {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata", Use::kNew},
    {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata", Use::kNew},
    {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata", Use::kNew},
    {"torch.distributed.checkpoint.metadata", "TensorProperties", Use::kNew},
    {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", Use::kCall, &one_int},
    {"torch.distributed.checkpoint.metadata", "MetadataIndex", Use::kNew},
    {"torch.distributed.checkpoint.metadata", "StorageMeta", Use::kNew},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo", Use::kNew},
    // Metadata.all_local_plans: megatron-core's torch_dist save keeps every
    // rank's SavePlan in the global metadata (to reuse it on the next save).
    // Read as data and never used (docs/megatron.md).
    {"torch.distributed.checkpoint.planner", "SavePlan", Use::kNew},
    {"torch.distributed.checkpoint.planner", "WriteItem", Use::kNew},
    {"torch.distributed.checkpoint.planner", "WriteItemType", Use::kCall, &one_int},
    {"torch.distributed.checkpoint.planner", "TensorWriteData", Use::kNew},
    {"torch.distributed.checkpoint.planner", "BytesIOWriteData", Use::kNew},
    // StorageMeta.checkpoint_id: pathlib (Python < 3.13) or pathlib._local (>= 3.13)
    {"pathlib", "PosixPath", Use::kCall, &all_str},
    {"pathlib", "WindowsPath", Use::kCall, &all_str},
    {"pathlib._local", "PosixPath", Use::kCall, &all_str},
    {"pathlib._local", "WindowsPath", Use::kCall, &all_str},

    // ---- DeepSpeed ZeRO optimizer files (deepspeed 0.19; docs/deepspeed.md) ----
    // Read as data: the enum's value, the records' state dicts. Nothing from
    // DeepSpeed is ever imported where ckptconv's outputs are loaded: the
    // torch_pt decoder turns each into its plain value.
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", Use::kCall, &one_int},
    {"deepspeed.runtime.fp16.loss_scaler", "LossScaler", Use::kNew},
    {"deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler", Use::kNew},
    {"deepspeed.utils.tensor_fragment", "fragment_address", Use::kNew},

    // ---- framework objects, decoded as data (src/pickle/framework_objects.h) ----
    // numpy (np.random.get_state() in a DCP item, Megatron-LM's rng_state),
    // under numpy 1.x's numpy.core and numpy 2.x's numpy._core: each in its
    // one pickle shape, then replaced by its plain value.
    {"numpy", "ndarray", Use::kValue},
    {"numpy", "dtype", Use::kCall, &numpy_dtype_args},
    {"numpy.core.multiarray", "_reconstruct", Use::kCall, &numpy_reconstruct_args},
    {"numpy._core.multiarray", "_reconstruct", Use::kCall, &numpy_reconstruct_args},
    {"numpy.core.multiarray", "scalar", Use::kCall, &numpy_scalar_args},
    {"numpy._core.multiarray", "scalar", Use::kCall, &numpy_scalar_args},
    // Megatron-LM's args: NEWOBJ with no arguments, BUILD with its dict.
    {"argparse", "Namespace", Use::kNew},
    // Megatron's enums (in args): called with one int, a member's value.
    {"megatron.core.enums", "ModelType", Use::kCall, &one_int},
    {"megatron.core.transformer.enums", "ModelType", Use::kCall, &one_int},
    {"megatron.core.transformer.enums", "LayerType", Use::kCall, &one_int},
    {"megatron.core.transformer.enums", "AttnType", Use::kCall, &one_int},
    {"megatron.core.transformer.enums", "AttnMaskType", Use::kCall, &one_int},
    {"megatron.core.transformer.enums", "AttnBackend", Use::kCall, &one_int},
    {"megatron.core.transformer.enums", "CudaGraphScope", Use::kCall, &one_int},
    // Megatron-LM's args.exit_signal, in every legacy rank file: a member's
    // number, as the Megatron enums (framework_objects.cc lists the members).
    {"signal", "Signals", Use::kCall, &one_int},
};

// Every torch.dtype by its str() name in torch 2.15 (torch.<name>): values.
// clang-format off
constexpr std::string_view kTorchDtypes[] = {
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "complex128", "complex64", "complex32", "bcomplex32",
    "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    "bool", "quint8", "qint8", "qint32", "quint4x2", "quint2x4",
    "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
};
// clang-format on

class Table {
 public:
  Table() {
    entries_.assign(std::begin(kAllowed), std::end(kAllowed));
    for (std::string_view name : kTorchDtypes) entries_.push_back({"torch", name, Use::kValue});
    std::sort(entries_.begin(), entries_.end(), less);
  }
  const Entry* find(std::string_view module, std::string_view name) const {
    Entry key{module, name, Use::kValue};
    auto it = std::lower_bound(entries_.begin(), entries_.end(), key, less);
    return it != entries_.end() && it->module == module && it->name == name ? &*it : nullptr;
  }

 private:
  static bool less(const Entry& a, const Entry& b) {
    return a.module != b.module ? a.module < b.module : a.name < b.name;
  }
  std::vector<Entry> entries_;
};

const Table& table() {
  static const Table t;
  return t;
}

const Entry* entry_of(const Value& v) { return v.is(Kind::kGlobal) ? table().find(v.text, v.name) : nullptr; }

// dtypes, layouts, memory formats and storage classes: torch.<name> values.
bool is_torch_value_global(const Value& v) {
  const Entry* e = entry_of(v);
  return e && e->use == Use::kValue && e->module == "torch";
}

bool is_tensor_class(const Value& v) {
  return v.is_global("torch", "Tensor") || v.is_global("torch.nn.parameter", "Parameter") ||
         v.is_global("torch.distributed._shard.sharded_tensor.api", "ShardedTensor") ||
         v.is_global("torch.distributed.tensor", "DTensor") || v.is_global("torch.distributed._tensor.api", "DTensor");
}

// The class getattr(ShardedTensor, 'ProcessGroupState') names (an enum
// member, the other getattr a stream may make, is no class).
bool is_process_group_state(const Value& v) {
  return v.is(Kind::kCall) && v.callable->is_global("builtins", "getattr") && v.args && v.args->is(Kind::kTuple) &&
         process_group_state_lookup(v.args->items);
}

bool call_accepted(const Value& callable, const std::vector<ValuePtr>& args) {
  const Entry* e = entry_of(callable);
  return e && e->use == Use::kCall && e->args && e->args(args);
}

bool new_accepted(const Value& cls) {
  const Entry* e = entry_of(cls);
  return (e && e->use == Use::kNew) || is_process_group_state(cls);
}

std::string describe_call(const Value& callable, const Value& args, CallOp op) {
  std::string rendered = args.repr(3, 6);
  if (args.is(Kind::kTuple) && rendered.size() >= 2) rendered = rendered.substr(1, rendered.size() - 2);
  if (args.is(Kind::kTuple) && args.items.size() == 1 && !rendered.empty() && rendered.back() == ',')
    rendered.pop_back();
  if (rendered.size() > 160) rendered = rendered.substr(0, 157) + "...";
  std::string fn = callable.is(Kind::kGlobal) ? callable.text + "." + callable.name : callable.repr(2, 4);
  return (op == CallOp::kNew ? fn + ".__new__(" : fn + "(") + rendered + ")";
}

// BUILD of a framework object in its one shape: a numpy array made by
// _reconstruct, a numpy dtype, a Namespace (decoded to a dict at NEWOBJ)
// given a dict of str keys.
bool framework_object_build(const Value& target, const Value& state) {
  if (is_decoded_namespace(target)) return namespace_state(state);
  if (is_opaque_record(target)) return true;
  if (!target.is(Kind::kCall) || target.newobj || !target.callable || !target.args || target.kwargs ||
      !target.args->is(Kind::kTuple) || !target.items.empty() || !target.entries.empty())
    return false;
  if (is_numpy_multiarray(*target.callable, "_reconstruct"))
    return numpy_reconstruct_args(target.args->items) && numpy_array_state(state);
  if (target.callable->is_global("numpy", "dtype")) return numpy_dtype_state(target, state);
  return false;
}

class CheckpointPolicy final : public GlobalPolicy {
 public:
  bool allows(std::string_view module, std::string_view name) const override {
    return table().find(module, name) != nullptr || is_opaque_global(module, name);
  }

  void check_call(const Value& callable, const Value& args, const Value* kwargs, CallOp op) const override {
    bool ok = false;
    if (args.is(Kind::kTuple) && is_opaque_global(callable)) {
      ok = !kwargs || kwargs->is(Kind::kDict);  // --allow-global: recorded, never called
    } else if (args.is(Kind::kTuple)) {
      if (op == CallOp::kNew) {
        ok = new_accepted(callable) && (!kwargs || kwargs->is(Kind::kDict));
        // A Namespace is made empty, then given its attributes by BUILD.
        if (is_namespace_class(callable)) ok = ok && args.items.empty() && !kwargs;
      } else {
        ok = !kwargs && call_accepted(callable, args.items);
        // A framework enum only by a value it has.
        if (framework_enum_class(callable)) ok = ok && framework_enum_value(callable, args.items).has_value();
      }
    }
    if (!ok) {
      fail(ErrorCode::kUnsafe, "the pickle calls " + describe_call(callable, args, op) +
                                   ", which is not a call a checkpoint makes; refusing to load it");
    }
  }

  void check_build(const Value& target, const Value& state) const override {
    // An OrderedDict's attributes (state_dict()._metadata), or the state of
    // an instance NEWOBJ made of an allowed class.
    bool attributes_of_dict = target.is(Kind::kDict) && target.ordered && state.is(Kind::kDict);
    bool allowed_instance = target.is(Kind::kCall) && target.newobj && new_accepted(*target.callable) &&
                            !is_namespace_class(*target.callable);
    if (!attributes_of_dict && !allowed_instance && !framework_object_build(target, state)) {
      std::string what = target.is(Kind::kCall)         ? describe_call(*target.callable, *target.args,
                                                                target.newobj ? CallOp::kNew : CallOp::kCall)
                         : is_decoded_namespace(target) ? "argparse.Namespace() to " + state.repr(2, 4)
                                                        : target.repr(2, 4);
      fail(ErrorCode::kUnsafe, "the pickle sets the state of " + what +
                                   " (BUILD), which is not something a checkpoint does; refusing to load it");
    }
  }

  void check_fill(const Value& target) const override {
    if (target.is(Kind::kList) || target.is(Kind::kDict) || target.is(Kind::kSet)) return;
    fail(ErrorCode::kUnsafe, "the pickle adds items to " + target.repr(2, 4) +
                                 " (APPENDS/SETITEMS on an object calls its methods), which a checkpoint never does; "
                                 "refusing to load it");
  }
};

}  // namespace

const GlobalPolicy& checkpoint_policy() {
  static const CheckpointPolicy policy;
  return policy;
}

// A quarantined global, or an object made by calling one.
bool QuarantinePolicy::quarantined(const Value& v) const {
  const Value* target = &v;
  if (target->is(Kind::kCall) && target->callable) target = target->callable.get();
  return target->is(Kind::kGlobal) && !base_.allows(target->text, target->name);
}

void QuarantinePolicy::check_call(const Value& callable, const Value& args, const Value* kwargs, CallOp op) const {
  // Calling the result of a quarantined call is refused like any other call.
  if (callable.is(Kind::kGlobal) && quarantined(callable)) return;
  base_.check_call(callable, args, kwargs, op);
}

void QuarantinePolicy::check_build(const Value& target, const Value& state) const {
  if (!quarantined(target)) base_.check_build(target, state);
}

void QuarantinePolicy::check_fill(const Value& target) const {
  if (!quarantined(target)) base_.check_fill(target);
}

std::string first_quarantined_global(const Value& root,
                                     const std::function<bool(std::string_view, std::string_view)>& known) {
  const Value* g = find_node(root, [&](const Value& v) { return v.is(Kind::kGlobal) && !known(v.text, v.name); });
  return g ? g->text + "." + g->name : std::string();
}

}  // namespace ckpt::pickle
