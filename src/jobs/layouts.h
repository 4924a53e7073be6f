// reshard's layouts: one entry per `--layout` value, the one place a
// layout-specific decision is made. jobs/reshard.cc looks the layout up here
// and asks its entry (never compares names); the CLI's `--layout` choices,
// its help text and the shell completions are generated from this table.
// Adding a layout is its writer function (jobs/layout_writers.h) and a row
// in layouts.cc (docs/architecture.md, "The layout table").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "jobs/layout_job.h"

namespace ckpt::jobs {

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
