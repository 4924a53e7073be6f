#include "formats/torch_pt/sharded_values.h"

#include <algorithm>

#include "core/error.h"
#include "formats/pyobj.h"

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
  t.stored_as = "ShardedTensor";
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
  t.stored_as = "DTensor";
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
    fail_data_loss("DTensor local tensor has shape " + shape_str(c.sizes) + ", its placement gives " + shape_str(sizes));
  c.offsets = offsets;
  if (ValuePtr rank = pyobj::field(mesh, "_rank"); rank && rank->is(Kind::kInt)) c.rank = static_cast<int>(rank->int_value);
  t.world_size = static_cast<int>(shape_numel(dims));
  t.chunks.push_back(std::move(c));
  t.sharding = desc;
  return t;
}

}  // namespace

std::pair<int64_t, int64_t> chunk_piece(int64_t size, int64_t n, int64_t coord) {
  if (n <= 0 || coord < 0 || coord >= n) fail_data_loss("mesh coordinate " + std::to_string(coord) + " outside 0.." + std::to_string(n - 1));
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

}  // namespace ckpt::torch_pt
