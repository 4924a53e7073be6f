// Reshard planner: for a target world size N, where each tensor of a
// CheckpointModel goes in the FSDP2 layout and which source chunk boxes
// feed each output piece. Pure: no I/O, tests assert on the plan.
//
// FSDP2 places a tensor with Shard(0) as torch.chunk does on dim 0:
// c = ceil(d0 / N) rows per rank, rank r holding rows
// [min(r*c, d0), min((r+1)*c, d0)); trailing ranks hold empty chunks, all at
// offset d0, which dcp.save deduplicates by (fqn, offset) to one item (kept
// here on the first empty rank). Replicated tensors (0-dim ones such as the
// optimizer `step`, and tensors the source itself kept whole) are written
// once, by rank 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt {

// The part of source chunk `chunk` (index into TensorEntry::chunks) that
// lands in an output item: the global box [offsets, offsets + sizes).
struct SourcePiece {
  std::size_t chunk = 0;
  Shape offsets;
  Shape sizes;
};

// One tensor item of an output rank: the global box it holds.
struct OutputItem {
  std::size_t tensor = 0;  // index into CheckpointModel::tensors
  Shape offsets;
  Shape sizes;
  std::vector<SourcePiece> pieces;  // non-empty overlaps, in source chunk order

  uint64_t numel() const { return shape_numel(sizes); }
};

struct ReshardPlan {
  int world_size = 0;
  std::vector<std::vector<OutputItem>> ranks;  // per output rank, tensors in model order
  std::vector<bool> replicated;                // per tensor
  // Per tensor: the output items holding it, in rank order, as (rank, item index).
  std::vector<std::vector<std::pair<int, std::size_t>>> items_of_tensor;
};

// Whether the source kept tensor `t` whole rather than sharded: 0-dim, or a
// single chunk covering it in a source written by more than one rank (a
// sharded tensor there has one chunk per rank, empty ones included). With a
// single-rank source nothing tells the two apart; FSDP2 shards parameters,
// so tensors with dimensions are treated as sharded.
bool is_replicated(const TensorEntry& t, int source_world_size);

// FSDP2's dim-0 box of rank `rank` out of `world_size` for `shape`.
void fsdp2_box(const Shape& shape, int world_size, int rank, Shape& offsets, Shape& sizes);

// InvalidArgument when world_size < 1. The model must have passed
// require_valid().
ReshardPlan plan_reshard(const std::vector<TensorEntry>& tensors, int world_size, int source_world_size);

// Per-rank files (FSDP1 SHARDED_STATE_DICT, docs/formats.md §3): every rank's
// file holds every tensor. Tensors `sharded[t]` get one item per rank, the
// torch.chunk box of dim 0 (empty on ranks past the last piece); the others
// (optimizer `step`, buffers) are written whole by every rank and marked
// `replicated`. At world size 1 every tensor is whole: FSDP1 runs NO_SHARD
// there, and its SHARDED_STATE_DICT save and load fall back to full state
// dicts of plain tensors. InvalidArgument when world_size < 1; Internal
// when a sharded tensor has no dimension.
ReshardPlan plan_rank_files(const std::vector<TensorEntry>& tensors, const std::vector<bool>& sharded, int world_size);

// The tensor an output item holds, as append_tensor reads it: shape = the
// item's box, each source piece a view of its chunk re-based to the box's
// origin.
TensorEntry item_tensor(const TensorEntry& t, const OutputItem& item);

// Rows [r0, r1) of dim 0 of `t` (0 <= r0 < r1 <= t.shape[0]), as item_tensor
// reads a box: one worker's piece of a tensor split across --part workers.
TensorEntry rows_tensor(const TensorEntry& t, int64_t r0, int64_t r1);

// The files one output rank writes, with their exact sizes.
struct RankFilesOut {
  std::vector<std::pair<std::string, uint64_t>> files;
};

// --dry-run: per output rank, its files and sizes, every item's box with
// the source chunks (rank and box) that feed it; `bytes_items` non-tensor
// items are written once by rank 0 (DCP) or by every rank (per-rank files:
// `per_rank_values`); `shared` are files outside the ranks (.metadata).
// Without `detailed` (-v), only the per-rank and total lines.
void describe_reshard(const CheckpointModel& model, const ReshardPlan& plan, std::size_t bytes_items,
                      bool per_rank_values, const std::vector<RankFilesOut>& rank_files,
                      const std::vector<std::pair<std::string, uint64_t>>& shared, bool detailed, std::ostream& out);

// Distinct ranks that wrote the model's chunks (TensorChunk::rank; at least 1).
int source_world_size(const CheckpointModel& model);

}  // namespace ckpt
