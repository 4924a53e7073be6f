// What `reshard SRC --layout megatron-legacy --tp T --pp P` writes
// (docs/megatron.md, "Writing legacy checkpoints"): a Megatron-LM
// ckpt_format=torch checkpoint for a job at TP T x PP P,
//
//   latest_checkpointed_iteration.txt           the iteration, or "release"
//   iter_<N:07d>/ (or release/)
//       mp_rank_<tp:02d>[_<pp:03d>]/model_optim_rng.pt
//
// each rank file a dict of the source's job entries (args with the new
// parallel sizes, checkpoint_version, iteration, ...) and `model`, the
// rank's piece of the TP=1/PP=1 model the legacy reader gives: the inverse
// of tp_layout.h (column-parallel rows, row-parallel columns, vocab rows,
// SwiGLU linear_fc1 as this rank's [gate_r; up_r]) and of the pipeline
// renumbering (stage p holds layers [p L/P, (p+1) L/P), numbered from 0).
// The optimizer and RNG states are per rank and are not written: the job
// loads it with --no-load-optim --no-load-rng.
#pragma once

#include <string>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt::megatron_legacy {

// One rank's model_optim_rng.pt: its state dict, whose tensor references
// index `tensors`, each a piece of a tensor of the model read (chunks into
// its files: nothing is read to plan).
struct LegacyRankFile {
  std::string name;  // "iter_0000007/mp_rank_01_000/model_optim_rng.pt"
  pickle::ValuePtr root;
  std::vector<TensorEntry> tensors;
};

struct LegacyOutput {
  std::string tracker;                // latest_checkpointed_iteration.txt: "7", or "release"
  std::vector<LegacyRankFile> files;  // PP rank after PP rank, TP rank after TP rank
};

// `legacy`: a Megatron-LM legacy checkpoint read whole (the model at
// TP=1/PP=1 and the job's args); InvalidArgument for another source or
// one read with --only, Unimplemented (exit 3) naming what does not split:
// layers that do not divide by PP, a TP-split dimension, query groups or
// the padded vocabulary that do not divide by TP, a parameter tp_layout.h
// does not know. Tied embeddings: the last stage's copy of the word
// embeddings (output_layer.weight) is written at PP > 1 and left out at
// PP = 1. No virtual pipeline stages are written.
LegacyOutput plan_legacy_output(const CheckpointModel& legacy, int tp, int pp);

}  // namespace ckpt::megatron_legacy
