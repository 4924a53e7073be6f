// The types of reshard's layout table (jobs/layouts.h): a layout's row and
// what its writer (jobs/layout_writers.h) works on. Apart from the table, so
// that the writers' declarations and the table include these and not each
// other.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

#include "exec/write_rank_files.h"
#include "jobs/common.h"
#include "jobs/requests.h"

namespace ckpt::jobs {

struct LayoutInfo;

// What a layout's writer works on: the request, its settled options, the
// model read and selected, how to copy, the report to fill and --dry-run's
// stream.
struct LayoutJob {
  const LayoutInfo& layout;
  const ReshardRequest& req;
  const JobOptions& job;
  const CheckpointModel& model;
  const CopyOptions& copy;
  JobReport& report;
  std::ostream& out;
  // The model was mapped back from a Hugging Face folder (docs/maps.md): in
  // the framework's names, with none of its own layout.
  bool mapped_back = false;
  // --args-from: the Megatron-LM job read whole (its args at the top), and
  // the Hugging Face config's vocab_size where a map padded the rows.
  const CheckpointModel* args_job = nullptr;
  std::optional<int64_t> config_vocab;
};

// How --world-size applies to a layout.
enum class WorldSizeRule {
  kRequired,  // written for one world size: --world-size N is required
  kAny,       // loads at any world size (deepspeed-universal): --world-size is not used
  kTpPp,      // one rank per TP x PP position (megatron-legacy): --tp and --pp, not --world-size
};

struct LayoutInfo {
  std::string_view name;  // --layout NAME, and in reports
  std::string_view help;  // for --layout's help: what is written, after the name
  // Read bare: --only's entry becomes the root (a per-rank file holds the
  // module's or the optimizer's state dict itself; the Hugging Face layout
  // names a model's tensors by their bare FQNs). Otherwise it stays under its
  // key, as a resumed job's dcp.load({"model": ...}) expects.
  bool bare = false;
  WorldSizeRule world_size = WorldSizeRule::kRequired;
  // Writes any source's tensors, a full state dict's too (the others need a
  // source of their own kind: an Accelerate folder, FSDP1 flat files, ...).
  bool any_source = false;
  // Per-rank files: ShardedTensor or DTensor values, and the file names of
  // their kind (model_rank{r}.pt, or veRL's model_world_size_{N}_rank_{r}.pt).
  RankLayout values = RankLayout::kShardedTensor;
  // Written without --layout for a source with no layout of its own (per-rank
  // files, ZeRO): the entry whose `values` match the source's tensors.
  bool default_by_values = false;
  // The writer: plans, then --dry-run's listing or the output
  // (finish_layout in jobs/reshard.cc).
  void (*write)(const LayoutJob& job) = nullptr;
};

}  // namespace ckpt::jobs
