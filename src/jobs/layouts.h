// reshard's layouts: one entry per `--layout` value, the one place a
// layout-specific decision is made. jobs/reshard.cc looks the layout up here
// and asks its entry (never compares names); the CLI's `--layout` choices,
// its help text and the shell completions are generated from this table.
// Adding a layout is its writer function (jobs/layout_writers.h) and a row
// in layouts.cc (docs/architecture.md, "The layout table").
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "exec/write_rank_files.h"
#include "jobs/common.h"
#include "jobs/reshard.h"

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
};

// How --world-size applies to a layout.
enum class WorldSizeRule {
  kRequired,  // written for one world size: --world-size N is required
  kAny,       // loads at any world size (deepspeed-universal): --world-size is not used
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
  bool part = true;  // --part: several processes may each write a share
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

// Every layout, in --layout's order.
const std::vector<LayoutInfo>& reshard_layouts();
// The entry named `name`; nullptr for none.
const LayoutInfo* find_layout(std::string_view name);

// The layout written without --layout: the source's own (its format's
// reshard_layout), else per-rank files of the source's values (DTensor or
// ShardedTensor).
const LayoutInfo& default_layout(const CheckpointModel& model);
// Whether the source is read bare (LayoutInfo::bare) for `requested`
// (--layout; empty: the default, which for a source with no layout of its
// own is one of the default_by_values layouts).
bool reads_bare(const std::string& requested, SourceKind kind);

// --layout's values, in order (CLI11 IsMember, completions).
std::vector<std::string> layout_choices();
// --layout's help: every entry's name and help.
std::string layout_help();
// "dcp|hf|...": the layouts that take any source (a full state dict's
// message).
std::string any_source_layouts();
// reshard's one-line description, naming every layout.
std::string reshard_description();
// --world-size's help, naming the layouts that load at any world size.
std::string world_size_help();

}  // namespace ckpt::jobs
