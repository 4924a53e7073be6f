// Merging the models read from the files of one per-rank family into one
// (see fsdp_ranks_reader.h for the rules).
#pragma once

#include <string>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::fsdp_ranks {

// Folds `other` (the file `other_file`) into `base` (rank 0's model, from
// `base_file`): both trees must have the same structure and equal plain
// values; sharded tensors gain other's chunks; plain tensors must hold equal
// bytes. DataLoss naming the key and both files on any difference; with a
// sink, every difference is reported there and the rest still merges.
void merge_rank_model(CheckpointModel& base, const std::string& base_file, const CheckpointModel& other,
                      const std::string& other_file, int other_rank = -1, ProblemSink* sink = nullptr);

// After every rank is merged: drops DTensor chunks that repeat a box another
// (lower) rank already holds, i.e. HSDP replicas. Returns how many it dropped.
std::size_t drop_replica_chunks(CheckpointModel& model);

}  // namespace ckpt::fsdp_ranks
