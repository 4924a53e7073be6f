// What a reader learned about a checkpoint besides its tensors and values:
// the kind of source, the files it consists of, its per-rank families, the
// world sizes it was written at and the DeviceMesh of DTensor files. Typed,
// so that nothing above the readers re-derives these facts from strings or by
// opening source files again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pickle/value.h"

namespace ckpt {

// kFsdpRanks: a directory without `.metadata` holding per-rank files, a glob
// pattern, or files listed with --files.
// kDcpPair: a checkpoint folder whose model and optimizer are two DCP
// directories (Accelerate's save_state: pytorch_model_fsdp_0/, optimizer_0/).
// kDcpHf: torch's DCP Hugging Face layout (per-rank safetensors with
// DCP_SHARDING_INFO, no .metadata).
// kDsUniversal: a DeepSpeed universal checkpoint (zero/<fqn>/*.pt).
// kMegatron: a Megatron-core torch_dist directory (DCP + metadata.json).
// kMegatronLegacy: a Megatron-LM ckpt_format=torch iteration folder
// (mp_rank_<tp>[_<pp>][_<ep>]/model_optim_rng.pt per model-parallel rank).
// kHfFolder: a Hugging Face model folder (save_pretrained): safetensors
// weights, with or without their index, beside config.json and the like.
// kHfBinFolder: the same with pytorch_model.bin weights (older
// save_pretrained, or --format pt), read when it has no safetensors ones.
enum class SourceKind {
  kTorchPt,
  kDcpDir,
  kFsdpRanks,
  kSafetensors,
  kSafetensorsIndex,
  kHdf5,
  kZero,
  kDcpPair,
  kHfFolder,
  kDcpHf,
  kDsUniversal,
  kMegatron,
  kHfBinFolder,
  kMegatronLegacy
};

// For messages: "DCP directory", "per-rank files", ...
const char* source_kind_name(SourceKind kind);
// The format name in reports, JSON and manifests: "pt", "dcp", "fsdp-ranks",
// "safetensors" (one file or an index), "hdf5", "deepspeed-zero".
const char* source_format_name(SourceKind kind);

// How a tensor was stored in its source.
// kBuffer: a module buffer, where the source says so (DeepSpeed's
// buffer_names): FSDP keeps buffers whole on every rank, never sharded.
enum class StorageKind { kTensor, kParameter, kShardedTensor, kDTensor, kBuffer };
// "tensor", "Parameter", "ShardedTensor", "DTensor", "buffer" (inspect, JSON).
const char* storage_kind_name(StorageKind kind);

// A DTensor's DeviceMesh as the files name it: what a job needs to write
// files on the same kind of mesh (see exec/write_rank_files.h).
struct DeviceMeshInfo {
  std::string device_type = "cpu";
  std::vector<std::string> dim_names;  // empty: None
};

// One family of per-rank files: the files whose names differ only in the rank.
struct RankFamilyInfo {
  std::string kind;           // "model", "optim" or "" (from the template)
  std::string first_file;     // a file of the family as found (its name gives the template)
  std::string name_template;  // e.g. "optim_rank{r}.pt"
  std::vector<std::string> files;
  int world_size = -1;
};

// A DCP source's flat layout, as its .metadata gives it: the keys in
// state_dict_metadata order (tensor or bytes item) and each key's
// planner_data path (how dcp.save flattened the state dict). A reshard
// keeps them, so that dcp.load sees the keys and nesting the job saved.
struct FlatLayout {
  std::vector<std::pair<std::string, bool>> items;  // (fqn, is_tensor)
  std::map<std::string, std::vector<pickle::ValuePtr>> planner_data;
  std::vector<std::string> planner_order;  // planner_data keys in file order
};

// What a source's own metadata says the checkpoint holds (DCP's .metadata),
// whether or not every file it names could be read: validate's totals, so a
// missing rank file shows as missing rather than as a smaller checkpoint.
struct DeclaredContents {
  std::size_t files = 0;  // data files named, plus the metadata itself
  std::size_t missing_files = 0;
  std::size_t tensors = 0;
  uint64_t tensor_bytes = 0;
};

// An FSDP1 flat-parameter source's structure (formats/fsdp_flat/), what
// writing such files for another world size needs: each unit's flat
// parameter, the mode and the tied names.
struct Fsdp1Unit {
  std::string key;                  // "blocks.0._flat_param"
  std::vector<std::string> params;  // its parameters' names, in flat order
  int alignment = 0;                // elements each parameter is aligned to (use_orig_params=True), else 0
};
struct Fsdp1Layout {
  bool use_orig_params = false;
  std::vector<Fsdp1Unit> units;  // in the order of the _flat_param keys (use_orig_params=False: the optimizer's ids)
  std::vector<std::pair<std::string, std::string>> aliases;  // tied name -> the parameter it shares
};

// A Megatron-core torch_dist checkpoint read whole (formats/megatron/):
// which top-level entries of its stored view came from common.pt, and
// which are sharded objects grouped back under their key (with their
// shape), so that reshard --layout megatron can store them as megatron-core
// does.
struct MegatronLayout {
  std::vector<std::string> common_keys;
  std::vector<std::pair<std::string, std::vector<int64_t>>> objects;
};

// A DeepSpeed checkpoint's parallel degrees, as its files record them
// (dp_world_size and the rank files of each stage; checkpoint_parallel_dimensions):
// what inspect shows. A data-parallel ZeRO run is {data N, 1, 1, 1}.
struct ParallelDegrees {
  int data = 1;
  int pipeline = 1;
  int tensor = 1;
  int expert = 1;
};

// How one parameter of a tensor-parallel DeepSpeed checkpoint was merged
// from its tensor-parallel slices, as the model's universal_checkpoint_info
// patterns say (formats/zero/tensor_parallel.h): what a universal
// checkpoint records beside it so that a loader at any tensor-parallel
// degree cuts it back the same way.
struct TensorParallelMerge {
  enum class Kind { kReplicated, kCat, kTwoSubParams };
  Kind kind = Kind::kCat;
  int cat_dim = 0;          // kCat (kTwoSubParams: 0)
  bool vocabulary = false;  // the padded vocabulary's rows cut off after the merge
};

// A tensor-parallel DeepSpeed checkpoint read merged: its degree and, by
// parameter FQN, how each trainable parameter was merged.
struct TensorParallelLayout {
  int degree = 1;
  std::map<std::string, TensorParallelMerge> params;
};

struct SourceInfo {
  SourceKind kind = SourceKind::kTorchPt;
  std::vector<std::string> files;           // the files read, sorted (per-rank sources; else SRC itself)
  std::vector<RankFamilyInfo> families;     // per-rank sources: the families read (after --only)
  std::vector<int> world_sizes;             // distinct world sizes the source was written at; {1} for single files
  std::optional<DeviceMeshInfo> mesh;       // per-rank DTensor files: the mesh of the first one that has one
  std::optional<FlatLayout> flat_layout;    // DCP directories
  std::optional<Fsdp1Layout> fsdp1;         // FSDP1 flat-parameter files read with --param-layout
  std::optional<MegatronLayout> megatron;   // a torch_dist checkpoint's stored view
  std::optional<ParallelDegrees> parallel;  // DeepSpeed ZeRO checkpoints
  std::optional<TensorParallelLayout> tensor_parallel;  // DeepSpeed TP ranks merged by their patterns
  // The source names tensors by flat dotted keys only (safetensors without
  // ckptconv.tree): how they nest is unknown, so diff compares paths only.
  bool flat_keys = false;
  std::optional<DeclaredContents> declared;
  // Files beside the tensors that a folder output carries unchanged (a
  // Hugging Face folder's config.json, generation_config.json, tokenizer
  // files): paths, sorted.
  std::vector<std::string> side_files;
  // Which parameters were frozen is known (TensorEntry::frozen): DeepSpeed
  // records trainable parameters (param_shapes) and buffers (buffer_names).
  bool records_frozen = false;  // sources with a metadata file that lists everything (DCP)

  bool is_sharded_source() const {
    return kind == SourceKind::kDcpDir || kind == SourceKind::kFsdpRanks || kind == SourceKind::kZero ||
           kind == SourceKind::kDcpPair || kind == SourceKind::kDcpHf || kind == SourceKind::kMegatron ||
           kind == SourceKind::kMegatronLegacy;
  }
};

}  // namespace ckpt
