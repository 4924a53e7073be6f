// The requests of the commands that write (consolidate, reshard), and how a
// --part run keeps one beside its parts (OUT.parts-<plan>/request.json) for
// `ckptconv finalize` to rerun: apart from the jobs themselves, so that
// finalize, which reruns them, and the jobs, which store their request,
// include this and not each other.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "jobs/common.h"

namespace ckpt::jobs {

struct ConsolidateRequest {
  CommonOptions common;
  std::string output;
  std::string format;                // pt|safetensors|hdf5; empty: by the output's extension
  std::string max_shard_size;        // safetensors
  std::string compression = "none";  // HDF5: none|gzip
  bool finite = false;               // count NaN/Inf in every tensor written (exit 1 when any)
  std::string part;                  // --part I/N|auto|finalize: this process's share (exec/parted_output.h)
  // -o DIR/: a folder whose config and tokenizer files the output folder
  // gets, instead of the source's (a training checkpoint has none)
  std::string config_from;
  // --map: the architecture map applied (docs/maps.md): a built-in name, a
  // file, "none"; empty: chosen by the source kind and config_from's config
  std::string map;
};

struct ReshardRequest {
  CommonOptions common;
  std::string output;
  // --world-size; absent only where the layout needs none (deepspeed-universal loads at any)
  std::optional<int> world_size;
  // a layout of jobs/layouts.cc; empty: the source's own
  std::string layout;
  // --tp / --pp: megatron-legacy: the tensor and pipeline parallel sizes of the job that loads it (default 1)
  std::optional<int> tp, pp;
  // --vpp: megatron-legacy: virtual pipeline stages per pipeline rank (default 1: none)
  std::optional<int> vpp;
  // --distributed-optimizer / --no-distributed-optimizer: megatron-legacy,
  // the optimizer written as the DistributedOptimizer's (distrib_optim.pt)
  // or as the plain one's; absent: as the source saved it
  std::optional<bool> distributed_optimizer;
  std::string mesh_device;                  // DTensor layout: the mesh's device type; empty: the source's, else cpu
  std::vector<std::string> mesh_dim_names;  // and its dimension name (veRL: fsdp); empty: the source's, else none
  std::string part;                         // --part I/N|auto|finalize: this process's share (exec/parted_output.h)
  // --update-latest: a deepspeed-universal output replaces an existing
  // latest_universal beside it (which the job may have read its source
  // through); without it an existing pointer is kept and only a missing one written.
  bool update_latest = false;
  // --expert-parallel: deepspeed-universal, the ep_size of the engine that
  // will load a MoE checkpoint; absent: the expert-parallel size the source
  // records (a source that records none and holds experts is refused).
  std::optional<int> expert_parallel;
  // The way back (docs/maps.md): --map (a built-in name, a file, "none";
  // empty: chosen for --layout megatron by the config's architectures),
  // --config-from (default: the source folder's config.json), and the
  // multiple the vocabulary is padded to (megatron's
  // make_vocab_size_divisible_by x TP).
  std::string map;
  std::string config_from;
  int64_t padded_vocab_multiple = 128;
  // --args-from CKPT: megatron-legacy from a Hugging Face folder, the
  // Megatron-LM job (legacy or torch_dist checkpoint) whose args the rank
  // files carry; empty: none (such a source is refused)
  std::string args_from;
};

// The request as the parts folder keeps it: the command, the directory it
// ran in, and every option that shapes the output.
// `folder`: the -o DIR/ given, when request.output is the weights file in it
// (finalizing then writes the folder's side files too).
std::string request_json(const ConsolidateRequest& request, const std::string& folder = "");
std::string request_json(const ReshardRequest& request);
// The common options of a kept request (nlohmann's exceptions when a field
// is missing or of another type: finalize reports them naming the file).
CommonOptions common_options_from_json(const nlohmann::ordered_json& json);

}  // namespace ckpt::jobs
