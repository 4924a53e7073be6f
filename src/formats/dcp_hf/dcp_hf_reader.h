// torch's DCP Hugging Face layout (torch >= 2.7's HuggingFaceStorageWriter
// with save_distributed=True; torchtitan's and torchtune's HF export): one
// safetensors file per rank, "shard-0000{r+1}-model-0000k-of-0000N.safetensors",
// each holding that rank's pieces under their FQNs. Each file's
// __metadata__ "DCP_SHARDING_INFO" is JSON {fqn: {"saved_offsets": [..]}}: where
// the piece starts in the global tensor; no file records a global shape, so
// each dimension is the largest offset + size over the pieces, as torch's
// HuggingFaceStorageReader computes it. No .metadata file is written.
// (With enable_consolidation=True the per-rank files go to sharded/ and the
// folder itself is a Hugging Face folder: formats/safetensors.)
#pragma once

#include <string>
#include <vector>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::dcp_hf {

// The .safetensors files directly in `dir`, sorted.
std::vector<std::string> list_safetensors(const std::string& dir);

// True when the first of them carries DCP_SHARDING_INFO.
bool is_dcp_hf_dir(const std::string& dir);

// The model: a flat dict FQN -> tensor, each tensor the pieces of every
// file at their offsets (empty pieces dropped). A file without
// DCP_SHARDING_INFO, a tensor it does not place, offsets of the wrong rank
// or one tensor in two dtypes is DataLoss naming file and tensor (`sink`,
// validate: reported there); gaps and overlaps are left to the coverage
// check every job runs.
CheckpointModel read_dcp_hf_dir(const std::string& dir, ProblemSink* sink = nullptr);

}  // namespace ckpt::dcp_hf
