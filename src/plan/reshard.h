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

// --dry-run: per output rank, its file and size (`file_bytes`), every
// item's box with the source chunks (rank and box) that feed it;
// `bytes_items` non-tensor items go to rank 0.
void describe_reshard(const CheckpointModel& model, const ReshardPlan& plan, std::size_t bytes_items,
                      const std::vector<uint64_t>& file_bytes, uint64_t metadata_bytes, std::ostream& out);

// Distinct ranks that wrote the model's chunks (TensorChunk::rank; at least 1).
int source_world_size(const CheckpointModel& model);

}  // namespace ckpt
