#include "formats/torch_pt/sharded_values.h"

#include <algorithm>

#include "archive/zip_reader.h"
#include "core/error.h"
#include "formats/pyobj.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"

namespace ckpt::torch_pt {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

const TensorEntry& local_tensor(const Value& ref, const std::vector<TensorEntry>& tensors, const char* what) {
  auto idx = tensor_ref_index(ref);
  if (!idx || *idx >= tensors.size() || tensors[*idx].chunks.size() != 1)
    fail_data_loss(std::string(what) + " is not a plain tensor");
  return tensors[*idx];
}

// (None, {...}) or {...}: the fields of a __slots__/dict state.
ValuePtr state_dict(const ValuePtr& state) {
  if (state && state->is(Kind::kTuple) && state->items.size() == 2 && state->items[1]->is(Kind::kDict))
    return state->items[1];
  if (state && state->is(Kind::kDict)) return state;
  fail_data_loss("unexpected tensor subclass state " + (state ? state->repr(2) : std::string("None")));
}

TensorEntry decode_sharded_tensor(const Value& args, const Value& state, const std::string& path,
                                  const std::vector<TensorEntry>& tensors) {
  const auto& parts = state.as_sequence();
  if (parts.size() < 2) fail_data_loss("ShardedTensor state has " + std::to_string(parts.size()) + " parts");
  const Value& meta = *parts[1];
  TensorEntry t;
  t.name = path;
  t.storage = StorageKind::kShardedTensor;
  t.shape = pyobj::int_sequence(*pyobj::require_field(meta, "size"), "ShardedTensor size");
  t.dtype = pyobj::torch_dtype(*args.as_sequence().at(1));
  for (const auto& shard : parts[0]->as_sequence()) {
    const Value& smeta = *pyobj::require_field(*shard, "metadata");
    const TensorEntry& local = local_tensor(*pyobj::require_field(*shard, "tensor"), tensors, "ShardedTensor shard");
    TensorChunk c = local.chunks[0];
    c.offsets = pyobj::int_sequence(*pyobj::require_field(smeta, "shard_offsets"), "shard_offsets");
    Shape sizes = pyobj::int_sequence(*pyobj::require_field(smeta, "shard_sizes"), "shard_sizes");
    if (sizes != c.sizes)
      fail_data_loss("shard sizes " + shape_str(sizes) + " differ from its tensor's shape " + shape_str(c.sizes));
    if (ValuePtr placement = pyobj::field(smeta, "placement"))
      if (ValuePtr rank = pyobj::field(*placement, "_rank"); rank && rank->is(Kind::kInt))
        c.rank = static_cast<int>(rank->int_value);
    t.chunks.push_back(std::move(c));
  }
  t.sharding = "ShardedTensor: " + std::to_string(pyobj::require_field(meta, "shards_metadata")->as_sequence().size()) +
               " shards in all";
  // ProcessGroupState(local_rank, global_rank, local_world_size, global_world_size)
  if (parts.size() > 2)
    if (ValuePtr ws = pyobj::field(*parts[2], "global_world_size"); ws && ws->is(Kind::kInt))
      t.world_size = static_cast<int>(ws->int_value);
  return t;
}

// Sizes of each mesh dimension: the `mesh` tensor's shape (older torch) or
// the shapes of the _FlatLayout axes of `_layout` (newer torch).
Shape mesh_shape(const Value& mesh, const std::vector<TensorEntry>& tensors) {
  if (ValuePtr m = pyobj::field(mesh, "mesh"))
    if (auto idx = tensor_ref_index(*m)) return tensors.at(*idx).shape;
  Shape out;
  if (ValuePtr layout = pyobj::field(mesh, "_layout")) {
    ValuePtr st = pyobj::state_of(*layout);
    if (st && st->is(Kind::kDict))
      for (const auto& [k, axes] : st->entries)
        if (axes->is(Kind::kTuple) || axes->is(Kind::kList))
          for (const auto& axis : axes->items)
            if (ValuePtr shape = pyobj::field(*axis, "shape")) {
              Shape s = pyobj::int_sequence(*shape, "mesh layout shape");
              out.insert(out.end(), s.begin(), s.end());
            }
  }
  if (out.empty()) fail(ErrorCode::kUnimplemented, "cannot find the DeviceMesh shape in this torch version's pickle");
  return out;
}

TensorEntry decode_dtensor(const Value& state_value, const std::string& path, const std::vector<TensorEntry>& tensors) {
  ValuePtr st = state_dict(std::make_shared<Value>(state_value));
  const TensorEntry& local = local_tensor(*st->at("_local_tensor"), tensors, "DTensor _local_tensor");
  const Value& spec = *st->at("_spec");
  const Value& meta = *pyobj::require_field(spec, "tensor_meta");
  // TensorMeta is a NamedTuple built by NEWOBJ(cls, (shape, stride, dtype)).
  const Value* meta_args = meta.is(Kind::kCall) && meta.args ? meta.args.get() : &meta;
  const auto& fields = meta_args->as_sequence();
  if (fields.size() < 3) fail_data_loss("DTensor tensor_meta has " + std::to_string(fields.size()) + " fields");
  TensorEntry t;
  t.name = path;
  t.storage = StorageKind::kDTensor;
  t.shape = pyobj::int_sequence(*fields[0], "DTensor shape");
  t.dtype = pyobj::torch_dtype(*fields[2]);

  const Value& mesh = *pyobj::require_field(spec, "mesh");
  Shape dims = mesh_shape(mesh, tensors);
  Shape coord = pyobj::int_sequence(*pyobj::require_field(mesh, "_coordinate_on_dim"), "mesh coordinate");
  const auto& placements = pyobj::require_field(spec, "placements")->as_sequence();
  if (coord.size() != dims.size() || placements.size() != dims.size())
    fail_data_loss("DTensor mesh of " + std::to_string(dims.size()) + " dims has " + std::to_string(placements.size()) +
                   " placements and a coordinate of " + std::to_string(coord.size()));
  TensorChunk c = local.chunks[0];
  Shape offsets(t.shape.size(), 0), sizes = t.shape;
  std::string desc = "DTensor: mesh " + shape_str(dims) + " at " + shape_str(coord) + ", placements (";
  for (std::size_t i = 0; i < placements.size(); ++i) {
    std::string cls = pyobj::class_name(*placements[i]);
    if (pyobj::is_class(*placements[i], "Replicate")) {
      desc += "Replicate";
    } else if (pyobj::is_class(*placements[i], "Shard")) {
      int64_t d = pyobj::require_field(*placements[i], "dim")->as_int();
      if (d < 0 || d >= static_cast<int64_t>(sizes.size())) fail_data_loss("Shard dim out of range");
      auto [off, len] = chunk_piece(sizes[d], dims[i], coord[i]);
      offsets[d] += off;
      sizes[d] = len;
      desc += "Shard(" + std::to_string(d) + ")";
    } else {
      fail(ErrorCode::kUnimplemented, "DTensor placement '" + cls + "' is not supported (Shard and Replicate are)");
    }
    desc += i + 1 < placements.size() ? ", " : ")";
  }
  if (sizes != c.sizes)
    fail_data_loss("DTensor local tensor has shape " + shape_str(c.sizes) + ", its placement gives " +
                   shape_str(sizes));
  c.offsets = offsets;
  if (ValuePtr rank = pyobj::field(mesh, "_rank"); rank && rank->is(Kind::kInt))
    c.rank = static_cast<int>(rank->int_value);
  t.world_size = static_cast<int>(shape_numel(dims));
  t.chunks.push_back(std::move(c));
  t.sharding = desc;
  return t;
}

}  // namespace

std::pair<int64_t, int64_t> chunk_piece(int64_t size, int64_t n, int64_t coord) {
  if (n <= 0 || coord < 0 || coord >= n)
    fail_data_loss("mesh coordinate " + std::to_string(coord) + " outside 0.." + std::to_string(n - 1));
  int64_t piece = (size + n - 1) / n;
  int64_t off = std::min(size, coord * piece);
  return {off, std::min(piece, size - off)};
}

std::optional<TensorEntry> decode_sharded_value(const Value& call, const Value& type, const std::string& path,
                                                const std::vector<TensorEntry>& tensors) {
  const auto& a = call.args->as_sequence();
  if (a.size() < 4) return std::nullopt;
  bool sharded = type.name == "ShardedTensor" && type.text.find("sharded_tensor") != std::string::npos;
  bool dtensor = type.name == "DTensor";
  if (!sharded && !dtensor) return std::nullopt;
  return with_context(std::string(sharded ? "ShardedTensor" : "DTensor") + " '" + path + "'", [&] {
    return sharded ? decode_sharded_tensor(*a[2], *a[3], path, tensors) : decode_dtensor(*a[3], path, tensors);
  });
}

// ---- writing ----

namespace {

ValuePtr ints(const Shape& s, bool as_list = false) {
  std::vector<ValuePtr> items;
  for (int64_t d : s) items.push_back(Value::integer(d));
  return as_list ? Value::list(std::move(items)) : Value::tuple(std::move(items));
}

ValuePtr strs(const std::vector<std::string>& items) {
  std::vector<ValuePtr> out;
  for (const auto& s : items) out.push_back(Value::str(s));
  return Value::tuple(std::move(out));
}

ValuePtr str_dict(std::vector<std::pair<std::string, ValuePtr>> fields) {
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;
  for (auto& [k, v] : fields) entries.emplace_back(Value::str(k), std::move(v));
  return Value::dict(std::move(entries));
}

// cls.__new__(cls, *args) then BUILD(state): how pickle saves plain objects.
ValuePtr object(const std::string& module, const std::string& cls, const ValuePtr& state,
                std::vector<ValuePtr> args = {}) {
  ValuePtr made = Value::call(Value::global(module, cls), Value::tuple(std::move(args)));
  made->newobj = true;
  return state ? Value::built(made, state) : made;
}

// A __slots__ class's state: (None, {slot: value}).
ValuePtr slots(std::vector<std::pair<std::string, ValuePtr>> fields) {
  return Value::tuple({Value::none(), str_dict(std::move(fields))});
}

ValuePtr torch_call(const std::string& module, const std::string& fn, std::vector<ValuePtr> args) {
  return Value::call(Value::global(module, fn), Value::tuple(std::move(args)));
}

ValuePtr cpu_device() { return torch_call("torch", "device", {Value::str("cpu")}); }
ValuePtr strided_layout() { return torch_call("torch.serialization", "_get_layout", {Value::str("torch.strided")}); }
ValuePtr dtype_global(DType d) { return Value::global("torch", std::string(dtype_name(d))); }
ValuePtr torch_size(const Shape& s) { return torch_call("torch", "Size", {ints(s)}); }

// _rebuild_from_type_v2(_rebuild_wrapper_subclass, cls, (cls, dtype, size,
// stride, storage_offset, layout, device, requires_grad), state).
ValuePtr wrapper_subclass(const ValuePtr& cls, DType dtype, const Shape& shape, const ValuePtr& state) {
  ValuePtr args = Value::tuple({cls, dtype_global(dtype), ints(shape), ints(contiguous_strides(shape)),
                                Value::integer(0), strided_layout(), cpu_device(), Value::boolean(false)});
  return torch_call("torch._tensor", "_rebuild_from_type_v2",
                    {Value::global("torch._utils", "_rebuild_wrapper_subclass"), cls, args, state});
}

// torch.chunk piece `r` of dim 0 as a box.
std::pair<Shape, Shape> chunk_box(const Shape& shape, int world_size, int r) {
  Shape offsets(shape.size(), 0), sizes = shape;
  auto [off, len] = chunk_piece(shape.at(0), world_size, r);
  offsets[0] = off;
  sizes[0] = len;
  return {offsets, sizes};
}

// _remote_device "rank:<r>/cpu".
ValuePtr remote_device(int r) {
  return object("torch.distributed.remote_device", "_remote_device",
                str_dict({{"_worker_name", Value::none()}, {"_rank", Value::integer(r)}, {"_device", cpu_device()}}));
}

ValuePtr shard_metadata(const Shape& offsets, const Shape& sizes, const ValuePtr& placement) {
  return object(
      "torch.distributed._shard.metadata", "ShardMetadata",
      slots({{"shard_offsets", ints(offsets, true)}, {"shard_sizes", ints(sizes, true)}, {"placement", placement}}));
}

}  // namespace

ValuePtr make_sharded_tensor(DType dtype, const Shape& shape, int rank, int world_size, const ValuePtr& local) {
  if (shape.empty()) fail(ErrorCode::kInternal, "a ShardedTensor needs a dimension to shard");
  const std::string st = "torch.distributed._shard.sharded_tensor.";
  std::vector<ValuePtr> shards, placements, local_shards;
  for (int r = 0; r < world_size; ++r) {
    auto [offsets, sizes] = chunk_box(shape, world_size, r);
    // torch.chunk returns no piece for ranks past the data (their box is empty).
    if (sizes[0] == 0 && r > 0) break;
    ValuePtr placement = remote_device(r);
    placements.push_back(placement);
    shards.push_back(shard_metadata(offsets, sizes, placement));
    if (r == rank)
      local_shards.push_back(
          object(st + "shard", "Shard",
                 slots({{"tensor", local}, {"metadata", shard_metadata(offsets, sizes, remote_device(r))}})));
  }
  // TensorProperties.__getstate__: (dtype, layout, requires_grad, MEM_FORMAT_ENCODING, pin_memory, strides)
  ValuePtr properties = object(st + "metadata", "TensorProperties",
                               Value::tuple({dtype_global(dtype), strided_layout(), Value::boolean(false),
                                             torch_call(st + "metadata", "MEM_FORMAT_ENCODING", {Value::integer(0)}),
                                             Value::boolean(false), Value::none()}));
  ValuePtr metadata = object(st + "metadata", "ShardedTensorMetadata",
                             str_dict({{"shards_metadata", Value::list(std::move(shards))},
                                       {"size", torch_size(shape)},
                                       {"tensor_properties", properties}}));
  ValuePtr cls = Value::global(st + "api", "ShardedTensor");
  // ShardedTensor.ProcessGroupState, a nested class: getattr(ShardedTensor, "ProcessGroupState").
  ValuePtr pg_class =
      Value::call(Value::global("builtins", "getattr"), Value::tuple({cls, Value::str("ProcessGroupState")}));
  ValuePtr pg_new = Value::call(pg_class, Value::tuple({}));
  pg_new->newobj = true;
  ValuePtr pg_state = Value::built(pg_new, str_dict({{"local_rank", Value::integer(rank)},
                                                     {"global_rank", Value::integer(rank)},
                                                     {"local_world_size", Value::integer(world_size)},
                                                     {"global_world_size", Value::integer(world_size)}}));
  ValuePtr spec = object("torch.distributed._shard.sharding_spec.chunk_sharding_spec", "ChunkShardingSpec",
                         str_dict({{"dim", Value::integer(0)}, {"placements", Value::list(std::move(placements))}}));
  ValuePtr state =
      Value::tuple({Value::list(std::move(local_shards)), metadata, pg_state, spec, Value::boolean(false)});
  return wrapper_subclass(cls, dtype, shape, state);
}

std::optional<MeshInfo> find_device_mesh(const SourcePtr& source) {
  archive::ZipReader zip(source);
  ValuePtr root = with_context(source->describe(), [&] {
    return with_context(
        "data.pkl", [&] { return pickle::unpickle(*zip.open(zip.record("data.pkl")), pickle::checkpoint_policy()); });
  });
  const Value* mesh =
      pickle::find_node(*root, [](const Value& v) { return v.is(Kind::kBuilt) && pyobj::is_class(v, "DeviceMesh"); });
  if (mesh) {
    MeshInfo info;
    if (ValuePtr type = pyobj::field(*mesh, "_device_type"); type && type->is(Kind::kStr))
      info.device_type = type->text;
    if (ValuePtr names = pyobj::field(*mesh, "_mesh_dim_names");
        names && (names->is(Kind::kTuple) || names->is(Kind::kList)))
      for (const auto& n : names->items) info.dim_names.push_back(n->as_str());
    return info;
  }
  return std::nullopt;
}

ValuePtr make_device_mesh(int rank, int world_size, const ValuePtr& rank_map, const MeshInfo& info) {
  const std::string layout = "torch.distributed._mesh_layout";
  ValuePtr axis = object(layout, "_FlatLayout", str_dict({{"shape", ints({world_size})}, {"stride", ints({1})}}));
  ValuePtr mesh_layout = object(layout, "_MeshLayout", str_dict({{"axes", Value::tuple({axis})}}));
  Shape all_ranks;
  for (int r = 0; r < world_size; ++r) all_ranks.push_back(r);
  return object("torch.distributed.device_mesh", "DeviceMesh",
                str_dict({{"_device_type", Value::str(info.device_type)},
                          {"_layout", mesh_layout},
                          {"_rank_map", rank_map},
                          {"_mesh_dim_names", info.dim_names.empty() ? Value::none() : strs(info.dim_names)},
                          {"_root_mesh", Value::none()},
                          {"_preserve_rank_order", Value::boolean(false)},
                          {"_flatten_rank_map", ints(all_ranks)},
                          {"_thread_id", Value::none()},
                          {"_flatten_mapping", Value::dict()},
                          {"_dim_group_names", Value::list({Value::str("0")})},
                          {"_rank", Value::integer(rank)},
                          {"_coordinate_on_dim", ints({rank})},
                          {"_hash", Value::none()}}));
}

ValuePtr make_dtensor(DType dtype, const Shape& shape, const ValuePtr& mesh, const ValuePtr& local) {
  if (shape.empty()) fail(ErrorCode::kInternal, "a sharded DTensor needs a dimension to shard");
  const std::string spec_module = "torch.distributed.tensor._dtensor_spec";
  ValuePtr shard0 = object("torch.distributed.tensor.placement_types", "Shard", str_dict({{"dim", Value::integer(0)}}));
  ValuePtr tensor_meta = object(spec_module, "TensorMeta", nullptr,
                                {torch_size(shape), ints(contiguous_strides(shape)), dtype_global(dtype)});
  // ShardOrderEntry(tensor_dim=0, mesh_dims=(0,)): dim 0 sharded over mesh dim 0.
  ValuePtr order = object(spec_module, "ShardOrderEntry", nullptr, {Value::integer(0), ints({0})});
  ValuePtr spec = object(spec_module, "DTensorSpec",
                         str_dict({{"mesh", mesh},
                                   {"placements", Value::tuple({shard0})},
                                   {"tensor_meta", tensor_meta},
                                   {"shard_order", Value::tuple({order})},
                                   {"use_strided_shard_as_shard_order", Value::boolean(false)},
                                   {"_hash", Value::none()}}));
  ValuePtr state = Value::tuple({Value::none(), str_dict({{"_local_tensor", local}, {"_spec", spec}})});
  return wrapper_subclass(Value::global("torch.distributed.tensor", "DTensor"), dtype, shape, state);
}

}  // namespace ckpt::torch_pt
