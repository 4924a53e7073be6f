#include "plan/reshard.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/paths.h"
#include "core/units.h"
#include "model/describe.h"

namespace ckpt {
namespace {

// Intersection of two boxes; false when it is empty in some dimension.
bool intersect(const Shape& ao, const Shape& as, const Shape& bo, const Shape& bs, Shape& off, Shape& size) {
  off.assign(ao.size(), 0);
  size.assign(ao.size(), 0);
  for (std::size_t d = 0; d < ao.size(); ++d) {
    int64_t lo = std::max(ao[d], bo[d]);
    int64_t hi = std::min(ao[d] + as[d], bo[d] + bs[d]);
    if (hi <= lo) return false;
    off[d] = lo;
    size[d] = hi - lo;
  }
  return true;
}

OutputItem make_item(const TensorEntry& t, std::size_t index, Shape offsets, Shape sizes) {
  OutputItem item;
  item.tensor = index;
  item.offsets = std::move(offsets);
  item.sizes = std::move(sizes);
  if (item.numel() == 0) return item;
  for (std::size_t c = 0; c < t.chunks.size(); ++c) {
    const TensorChunk& chunk = t.chunks[c];
    if (chunk.numel() == 0) continue;
    SourcePiece piece;
    piece.chunk = c;
    if (intersect(item.offsets, item.sizes, chunk.offsets, chunk.sizes, piece.offsets, piece.sizes))
      item.pieces.push_back(std::move(piece));
  }
  return item;
}

// A plan with no items yet; InvalidArgument when world_size < 1.
ReshardPlan empty_plan(std::size_t tensors, int world_size) {
  if (world_size < 1) fail_invalid("--world-size must be at least 1 (got " + std::to_string(world_size) + ")");
  ReshardPlan plan;
  plan.world_size = world_size;
  plan.ranks.resize(static_cast<std::size_t>(world_size));
  plan.replicated.resize(tensors);
  plan.items_of_tensor.resize(tensors);
  return plan;
}

// Appends `item` (of tensor `tensor`) to rank `rank`.
void add_item(ReshardPlan& plan, std::size_t tensor, int rank, OutputItem item) {
  auto& items = plan.ranks[static_cast<std::size_t>(rank)];
  plan.items_of_tensor[tensor].emplace_back(rank, items.size());
  items.push_back(std::move(item));
}

}  // namespace

void describe_reshard(const CheckpointModel& model, const ReshardPlan& plan, std::size_t bytes_items,
                      bool per_rank_values, const std::vector<RankFilesOut>& rank_files,
                      const std::vector<std::pair<std::string, uint64_t>>& shared, bool detailed, std::ostream& out) {
  uint64_t total = 0;
  std::size_t files = 0;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
    uint64_t data = 0;
    for (const OutputItem& item : plan.ranks[r]) data += item.numel() * dtype_size(model.tensors[item.tensor].dtype);
    out << "rank " << r << ": ";
    if (r < rank_files.size()) {
      for (std::size_t f = 0; f < rank_files[r].files.size(); ++f) {
        const auto& [name, bytes] = rank_files[r].files[f];
        out << (f ? "; " : "") << name << ", " << bytes << " bytes (" << human_bytes(bytes) << ")";
        total += bytes;
        ++files;
      }
    }
    out << ", " << plan.ranks[r].size() << " tensor items";
    if (per_rank_values || r == 0) out << ", " << bytes_items << (per_rank_values ? " other values" : " bytes items");
    out << ", " << data << " bytes of tensor data\n";
    if (!detailed) continue;
    for (const OutputItem& item : plan.ranks[r]) {
      const TensorEntry& t = model.tensors[item.tensor];
      out << "  " << t.name << " " << box_str(item.offsets, item.sizes)
          << (plan.replicated[item.tensor] ? " (replicated)" : "") << " <-";
      if (item.pieces.empty()) out << " (empty)";
      for (std::size_t p = 0; p < item.pieces.size(); ++p) {
        const SourcePiece& piece = item.pieces[p];
        const TensorChunk& c = t.chunks[piece.chunk];
        out << (p ? ", " : " ")
            << (c.rank >= 0 ? "source rank " + std::to_string(c.rank) : "source " + file_name(c.file)) << " "
            << box_str(piece.offsets, piece.sizes);
      }
      out << "\n";
    }
  }
  std::string shared_names;
  for (const auto& [name, bytes] : shared) {
    out << name << ": " << bytes << " bytes\n";
    total += bytes;
    shared_names += " and " + name;
  }
  out << "total: " << files << " files" << shared_names << ", " << total << " bytes (" << human_bytes(total) << ")\n";
  if (!detailed) out << "(-v lists every tensor item and the source chunks that feed it)\n";
}

bool is_replicated(const TensorEntry& t, int source_world_size) {
  if (t.shape.empty()) return true;
  if (source_world_size <= 1 || t.chunks.size() != 1) return false;
  const TensorChunk& c = t.chunks[0];
  return c.sizes == t.shape && std::all_of(c.offsets.begin(), c.offsets.end(), [](int64_t o) { return o == 0; });
}

void fsdp2_box(const Shape& shape, int world_size, int rank, Shape& offsets, Shape& sizes) {
  offsets.assign(shape.size(), 0);
  sizes = shape;
  if (shape.empty()) return;
  int64_t d0 = shape[0];
  int64_t per_rank = (d0 + world_size - 1) / world_size;
  int64_t begin = std::min<int64_t>(per_rank * rank, d0);
  int64_t end = std::min<int64_t>(begin + per_rank, d0);
  offsets[0] = begin;
  sizes[0] = end - begin;
}

ReshardPlan plan_reshard(const std::vector<TensorEntry>& tensors, int world_size, int source_world_size) {
  ReshardPlan plan = empty_plan(tensors.size(), world_size);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorEntry& t = tensors[i];
    auto add = [&](int rank, OutputItem item) { add_item(plan, i, rank, std::move(item)); };
    plan.replicated[i] = is_replicated(t, source_world_size);
    if (plan.replicated[i]) {
      add(0, make_item(t, i, Shape(t.shape.size(), 0), t.shape));
      continue;
    }
    bool empty_written = false;  // dcp.save keeps one empty chunk per (fqn, offset)
    for (int r = 0; r < world_size; ++r) {
      Shape offsets, sizes;
      fsdp2_box(t.shape, world_size, r, offsets, sizes);
      if (shape_numel(sizes) == 0) {
        if (empty_written) continue;
        empty_written = true;
      }
      add(r, make_item(t, i, std::move(offsets), std::move(sizes)));
    }
  }
  return plan;
}

ReshardPlan plan_rank_files(const std::vector<TensorEntry>& tensors, const std::vector<bool>& sharded, int world_size) {
  ReshardPlan plan = empty_plan(tensors.size(), world_size);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorEntry& t = tensors[i];
    bool split = sharded.at(i) && world_size > 1;
    plan.replicated[i] = !split;
    if (split && t.shape.empty()) fail(ErrorCode::kInternal, t.name + ": a 0-dim tensor cannot be sharded");
    for (int r = 0; r < world_size; ++r) {
      Shape offsets(t.shape.size(), 0), sizes = t.shape;
      if (split) fsdp2_box(t.shape, world_size, r, offsets, sizes);  // FSDP1 chunks dim 0 as FSDP2 does
      add_item(plan, i, r, make_item(t, i, std::move(offsets), std::move(sizes)));
    }
  }
  return plan;
}

TensorEntry item_tensor(const TensorEntry& t, const OutputItem& item) {
  TensorEntry local;
  local.name = t.name;
  local.dtype = t.dtype;
  local.out_dtype = t.out_dtype;
  local.shape = item.sizes;
  for (const SourcePiece& piece : item.pieces) {
    TensorChunk c = t.chunks.at(piece.chunk);
    int64_t storage_offset = c.storage_offset;
    for (std::size_t d = 0; d < piece.offsets.size(); ++d)
      storage_offset += (piece.offsets[d] - c.offsets[d]) * c.strides[d];
    Shape offsets(piece.offsets.size());
    for (std::size_t d = 0; d < offsets.size(); ++d) offsets[d] = piece.offsets[d] - item.offsets[d];
    c.storage_offset = storage_offset;
    c.offsets = std::move(offsets);
    c.sizes = piece.sizes;
    local.chunks.push_back(std::move(c));
  }
  return local;
}

TensorEntry rows_tensor(const TensorEntry& t, int64_t r0, int64_t r1) {
  if (t.shape.empty() || r0 < 0 || r1 <= r0 || r1 > t.shape[0])
    fail(ErrorCode::kInternal,
         "rows " + std::to_string(r0) + ".." + std::to_string(r1) + " of " + t.name + " " + shape_str(t.shape));
  Shape offsets(t.shape.size(), 0), sizes = t.shape;
  offsets[0] = r0;
  sizes[0] = r1 - r0;
  return item_tensor(t, make_item(t, 0, std::move(offsets), std::move(sizes)));
}

int source_world_size(const CheckpointModel& model) {
  std::set<int> ranks;
  for (const auto& t : model.tensors)
    for (const auto& c : t.chunks)
      if (c.rank >= 0) ranks.insert(c.rank);
  return std::max<int>(1, static_cast<int>(ranks.size()));
}

}  // namespace ckpt
