// reshard's layout table (jobs/layouts.h): one entry per --layout value,
// each with its writer, and the flags run_reshard asks instead of comparing
// names. The expected values are the decisions jobs/reshard.cc made by name
// before the table (kBareLayouts, the universal world-size rule, accelerate's
// --part refusal).
#include <catch2/catch.hpp>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/registry.h"
#include "jobs/layouts.h"
#include "jobs/reshard.h"
#include "jobs/source_kinds.h"

using namespace ckpt;
using namespace ckpt::jobs;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

const std::vector<std::string> kNames = {"dcp",          "hf",         "fsdp-sharded-tensor",
                                         "fsdp-dtensor", "accelerate", "deepspeed-universal",
                                         "fsdp1-flat",   "megatron",   "megatron-legacy"};

}  // namespace

TEST_CASE("layout table: every --layout value once, in order, each with a writer and help", "[jobs][layouts]") {
  CHECK(layout_choices() == kNames);
  std::set<std::string_view> seen;
  for (const LayoutInfo& l : reshard_layouts()) {
    INFO(l.name);
    CHECK(l.write != nullptr);
    CHECK_FALSE(l.help.empty());
    CHECK(seen.insert(l.name).second);
    CHECK(find_layout(l.name) == &l);
    CHECK(contains(layout_help(), std::string(l.name) + " (" + std::string(l.help) + ")"));
    CHECK(contains(reshard_description(), std::string(l.name)));
  }
  CHECK(find_layout("nosuch") == nullptr);
  CHECK(find_layout("") == nullptr);
}

TEST_CASE("layout table: bare, world-size and any-source flags as run_reshard decided them by name",
          "[jobs][layouts]") {
  const std::set<std::string> bare = {"hf", "fsdp-sharded-tensor", "fsdp-dtensor", "fsdp1-flat"};
  for (const LayoutInfo& l : reshard_layouts()) {
    const std::string name(l.name);
    INFO(name);
    CHECK(l.bare == (bare.count(name) > 0));
    CHECK((l.world_size == WorldSizeRule::kAny) == (name == "deepspeed-universal"));
    CHECK((l.world_size == WorldSizeRule::kTpPp) == (name == "megatron-legacy"));
  }
  CHECK(any_source_layouts() == "dcp|hf|fsdp-sharded-tensor|fsdp-dtensor");
  CHECK(world_size_help() ==
        "Number of ranks to write (required, except for deepspeed-universal, which loads at any; and megatron-legacy, "
        "whose ranks are --tp x --pp)");
  CHECK(find_layout("fsdp-dtensor")->values == RankLayout::kDTensor);
  CHECK(find_layout("fsdp-sharded-tensor")->values == RankLayout::kShardedTensor);
  CHECK(find_layout("fsdp1-flat")->values == RankLayout::kShardedTensor);  // model_rank{r}.pt names
}

TEST_CASE("layout table: every source format's own layout is an entry, read bare as before", "[jobs][layouts]") {
  // The old rule: bare when the planned layout (the source's own) is one of
  // these, "" (no own layout: per-rank files by their values) included.
  const std::set<std::string> old_bare = {"", "hf", "fsdp-sharded-tensor", "fsdp-dtensor", "fsdp1-flat"};
  for (const InputFormat* f : input_formats()) {
    const std::string own(f->traits.reshard_layout);
    INFO(source_kind_name(f->kind) << " (own layout '" << own << "')");
    if (!own.empty()) CHECK(find_layout(own) != nullptr);
    CHECK(reads_bare("", f->kind) == (old_bare.count(own) > 0));
    for (const std::string& name : kNames) CHECK(reads_bare(name, f->kind) == (old_bare.count(name) > 0));
  }
}

TEST_CASE("layout table: without --layout, per-rank files are written with the source's values", "[jobs][layouts]") {
  CheckpointModel m;
  m.info.kind = SourceKind::kTorchPt;
  TensorEntry t;
  t.storage = StorageKind::kShardedTensor;
  m.tensors.push_back(t);
  CHECK(default_layout(m).name == "fsdp-sharded-tensor");
  m.tensors.back().storage = StorageKind::kDTensor;
  CHECK(default_layout(m).name == "fsdp-dtensor");
  m.info.kind = SourceKind::kDcpDir;
  CHECK(default_layout(m).name == "dcp");
  m.info.kind = SourceKind::kMegatron;
  CHECK(default_layout(m).name == "megatron");
}

TEST_CASE("reshard --layout with a name not in the table is a usage error naming the layouts", "[jobs][layouts]") {
  ReshardRequest req;
  req.common.source = "unused";
  req.output = "unused";
  req.world_size = 2;
  req.layout = "nosuch";
  std::ostringstream out;
  try {
    run_reshard(req, out);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    for (const std::string& name : kNames) CHECK(contains(e.message(), name));
  }
}

TEST_CASE("source kinds help: every registered format, by its kind's name and its own description", "[jobs][layouts]") {
  const std::string help = source_kinds_help();
  const std::string names = source_kind_names();
  for (const InputFormat* f : input_formats()) {
    INFO(source_kind_name(f->kind));
    CHECK_FALSE(f->description.empty());
    CHECK(contains(help, std::string(source_kind_name(f->kind)) + ": " + std::string(f->description)));
    CHECK(contains(names, source_kind_name(f->kind)));
  }
}
