// The checkpoint allow-list: exact (module, name) pairs. Each group says where
// it was seen; docs/pickle-globals.md lists which file kinds name which global
// (found by pickletools on checkpoints written with torch 2.15 / Python 3.11,
// plus the older module paths FORMATS.md names). Module names are as the
// unpickler reports them: protocol < 3 `__builtin__` already mapped to
// `builtins`, as CPython does.
#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "pickle/policy.h"

namespace ckpt::pickle {
namespace {

using Global = std::pair<std::string_view, std::string_view>;

constexpr Global kAllowed[] = {
    // ---- plain data that protocol-2 pickles through constructors ----
    // OrderedDict state dicts and _rebuild_tensor_v2's backward hooks.
    {"collections", "OrderedDict"},
    // bytes at protocol < 3 (_codecs.encode(latin-1 str, 'latin1')), sets,
    // bytearray, empty bytes, complex scalars.
    {"_codecs", "encode"},
    {"builtins", "set"},
    {"builtins", "frozenset"},
    {"builtins", "bytearray"},
    {"builtins", "bytes"},
    {"builtins", "complex"},
    // getattr(ShardedTensor, 'ProcessGroupState') in ShardedTensor state.
    {"builtins", "getattr"},

    // ---- torch.save tensors (torch/_utils.py, torch/_tensor.py) ----
    {"torch._utils", "_rebuild_tensor"},  // files of torch 0.4-1.x
    {"torch._utils", "_rebuild_tensor_v2"},
    {"torch._utils", "_rebuild_tensor_v3"},  // float8, uint16/32/64 with UntypedStorage
    {"torch._utils", "_rebuild_parameter"},
    {"torch._utils", "_rebuild_parameter_with_state"},
    {"torch._utils", "_rebuild_wrapper_subclass"},  // ShardedTensor, DTensor
    {"torch._tensor", "_rebuild_from_type_v2"},
    {"torch", "Tensor"},
    {"torch.nn.parameter", "Parameter"},
    {"torch", "Size"},
    {"torch", "device"},
    // layouts pickle as _get_layout('torch.strided'); older files name them
    {"torch.serialization", "_get_layout"},
    {"torch", "strided"},
    {"torch", "sparse_coo"},
    {"torch", "sparse_csr"},
    // memory formats pickle by name
    {"torch", "contiguous_format"},
    {"torch", "channels_last"},
    {"torch", "channels_last_3d"},
    {"torch", "preserve_format"},

    // ---- storage classes (torch._storage_classes; data.pkl persistent ids) ----
    {"torch", "DoubleStorage"},
    {"torch", "FloatStorage"},
    {"torch", "HalfStorage"},
    {"torch", "BFloat16Storage"},
    {"torch", "LongStorage"},
    {"torch", "IntStorage"},
    {"torch", "ShortStorage"},
    {"torch", "CharStorage"},
    {"torch", "ByteStorage"},
    {"torch", "BoolStorage"},
    {"torch", "ComplexDoubleStorage"},
    {"torch", "ComplexFloatStorage"},
    {"torch", "QUInt8Storage"},
    {"torch", "QInt8Storage"},
    {"torch", "QInt32Storage"},
    {"torch", "QUInt4x2Storage"},
    {"torch", "QUInt2x4Storage"},
    {"torch", "UntypedStorage"},
    {"torch.storage", "UntypedStorage"},  // as torch 2.x pickles it
    {"torch.storage", "TypedStorage"},

    // ---- dtypes by name (str(dtype) of every torch.dtype in torch 2.15) ----
    {"torch", "float64"}, {"torch", "float32"}, {"torch", "float16"}, {"torch", "bfloat16"},
    {"torch", "float8_e4m3fn"}, {"torch", "float8_e5m2"}, {"torch", "float8_e4m3fnuz"},
    {"torch", "float8_e5m2fnuz"}, {"torch", "float8_e8m0fnu"}, {"torch", "float4_e2m1fn_x2"},
    {"torch", "complex128"}, {"torch", "complex64"}, {"torch", "complex32"}, {"torch", "bcomplex32"},
    {"torch", "int64"}, {"torch", "int32"}, {"torch", "int16"}, {"torch", "int8"},
    {"torch", "uint64"}, {"torch", "uint32"}, {"torch", "uint16"}, {"torch", "uint8"},
    {"torch", "int1"}, {"torch", "int2"}, {"torch", "int3"}, {"torch", "int4"},
    {"torch", "int5"}, {"torch", "int6"}, {"torch", "int7"},
    {"torch", "uint1"}, {"torch", "uint2"}, {"torch", "uint3"}, {"torch", "uint4"},
    {"torch", "uint5"}, {"torch", "uint6"}, {"torch", "uint7"},
    {"torch", "bool"}, {"torch", "quint8"}, {"torch", "qint8"}, {"torch", "qint32"},
    {"torch", "quint4x2"}, {"torch", "quint2x4"},
    {"torch", "bits8"}, {"torch", "bits16"}, {"torch", "bits1x8"}, {"torch", "bits2x4"}, {"torch", "bits4x2"},

    // ---- ShardedTensor (torch/distributed/_shard; per-rank FSDP files) ----
    {"torch.distributed._shard.sharded_tensor.api", "ShardedTensor"},
    {"torch.distributed._shard.sharded_tensor.shard", "Shard"},
    {"torch.distributed._shard.metadata", "ShardMetadata"},
    {"torch.distributed._shard.sharded_tensor.metadata", "ShardedTensorMetadata"},
    {"torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"},  // also DCP <= 2.2
    {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"},
    {"torch.distributed._shard.sharding_spec.chunk_sharding_spec", "ChunkShardingSpec"},
    {"torch.distributed._shard.sharding_spec.api", "EnumerableShardingSpec"},
    {"torch.distributed.remote_device", "_remote_device"},

    // ---- DTensor (torch/distributed/tensor; torch 2.15 paths) ----
    {"torch.distributed.tensor", "DTensor"},
    {"torch.distributed.tensor._dtensor_spec", "DTensorSpec"},
    {"torch.distributed.tensor._dtensor_spec", "TensorMeta"},
    {"torch.distributed.tensor._dtensor_spec", "ShardOrderEntry"},
    {"torch.distributed.tensor.placement_types", "Shard"},
    {"torch.distributed.tensor.placement_types", "Replicate"},
    {"torch.distributed.tensor.placement_types", "Partial"},
    {"torch.distributed.tensor.placement_types", "_Partial"},
    {"torch.distributed.tensor.placement_types", "_StridedShard"},
    {"torch.distributed.device_mesh", "DeviceMesh"},
    {"torch.distributed._mesh_layout", "_MeshLayout"},
    {"torch.distributed._mesh_layout", "_FlatLayout"},
    // ---- DTensor, older torch (torch.distributed._tensor, <= 2.4) ----
    {"torch.distributed._tensor.api", "DTensor"},
    {"torch.distributed._tensor.placement_types", "Shard"},
    {"torch.distributed._tensor.placement_types", "Replicate"},
    {"torch.distributed._tensor.placement_types", "Partial"},
    {"torch.distributed._tensor.placement_types", "_Partial"},
    {"torch.distributed._tensor.placement_types", "_StridedShard"},
    {"torch.distributed._tensor.placement_types", "DTensorSpec"},
    {"torch.distributed._tensor.placement_types", "TensorMeta"},
    {"torch.distributed._tensor._dtensor_spec", "DTensorSpec"},
    {"torch.distributed._tensor._dtensor_spec", "TensorMeta"},
    {"torch.distributed._tensor.device_mesh", "DeviceMesh"},

    // ---- DCP .metadata (torch/distributed/checkpoint/{metadata,filesystem}.py) ----
    {"torch.distributed.checkpoint.metadata", "Metadata"},
    {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata"},
    {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata"},
    {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
    {"torch.distributed.checkpoint.metadata", "TensorProperties"},
    {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"},
    {"torch.distributed.checkpoint.metadata", "MetadataIndex"},
    {"torch.distributed.checkpoint.metadata", "StorageMeta"},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
    // StorageMeta.checkpoint_id: pathlib (Python < 3.13) or pathlib._local (>= 3.13)
    {"pathlib", "PosixPath"},
    {"pathlib", "WindowsPath"},
    {"pathlib._local", "PosixPath"},
    {"pathlib._local", "WindowsPath"},
};

class AllowListPolicy final : public GlobalPolicy {
 public:
  AllowListPolicy() : sorted_(std::begin(kAllowed), std::end(kAllowed)) {
    std::sort(sorted_.begin(), sorted_.end());
  }
  bool allows(std::string_view module, std::string_view name) const override {
    return std::binary_search(sorted_.begin(), sorted_.end(), Global{module, name});
  }

 private:
  std::vector<Global> sorted_;
};

}  // namespace

const GlobalPolicy& checkpoint_policy() {
  static const AllowListPolicy policy;
  return policy;
}

}  // namespace ckpt::pickle
