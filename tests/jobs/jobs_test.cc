// Jobs run without a process: request in, report and printed plan out, on
// the real-torch fixtures of testdata/. And the SourceInfo they rely on is
// what the readers found.
#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>
#include <string>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "formats/detect.h"
#include "jobs/consolidate.h"
#include "jobs/reshard.h"

using namespace ckpt;

namespace {

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("per-rank DTensor files: the reader names both families, the world size and the mesh", "[jobs]") {
  CheckpointModel m = read_checkpoint(testdata("fsdp_dt/adamw_ws2"));
  CHECK(m.info.kind == SourceKind::kFsdpRanks);
  CHECK(std::string(m.format()) == "fsdp-ranks");
  REQUIRE(m.info.families.size() == 2);
  CHECK(m.info.world_sizes == std::vector<int>{2});
  CHECK(m.info.files.size() == 4);  // model_full.pt / optim_full.pt name no rank: not part of it
  for (const auto& f : m.info.families) {
    CHECK(f.world_size == 2);
    CHECK(f.files.size() == 2);
    CHECK((f.name_template == "model_world_size_{N}_rank_{r}.pt" ||
           f.name_template == "optim_world_size_{N}_rank_{r}.pt"));
  }
  REQUIRE(m.info.mesh);
  CHECK(m.info.mesh->device_type == "cpu");
  CHECK(m.tensors.front().storage == StorageKind::kDTensor);
}

TEST_CASE("single files and DCP directories say their kind, files and world size", "[jobs]") {
  CheckpointModel pt = read_checkpoint(testdata("pt/dtypes.pt"));
  CHECK(pt.info.kind == SourceKind::kTorchPt);
  CHECK(pt.info.world_sizes == std::vector<int>{1});
  CHECK(pt.info.files == std::vector<std::string>{testdata("pt/dtypes.pt")});
  CheckpointModel dcp = read_checkpoint(testdata("dcp/fsdp2_adamw_ws3"));
  CHECK(dcp.info.kind == SourceKind::kDcpDir);
  CHECK(dcp.info.world_sizes == std::vector<int>{3});
  CHECK(dcp.info.files.size() == 4);  // .metadata and three .distcp
  CHECK_FALSE(dcp.info.mesh);
}

namespace {
// -v: a --dry-run plan lists every chunk (core/log.h verbose()).
struct VerboseScope {
  VerboseScope() { spdlog::set_level(spdlog::level::debug); }
  ~VerboseScope() { spdlog::set_level(spdlog::level::info); }
};
}  // namespace

TEST_CASE("reshard dry run: per output rank its files, exact sizes and source chunks, nothing written", "[jobs]") {
  VerboseScope verbose;
  jobs::ReshardRequest req;
  req.common.source = testdata("fsdp_st/adamw_ws3");
  req.common.dry_run = true;
  req.output = (std::filesystem::temp_directory_path() / "ckptconv-jobs-test-never-written").string();
  req.world_size = 2;
  std::ostringstream out;
  jobs::JobReport report = jobs::run_reshard(req, out);
  CHECK(report.dry_run);
  CHECK(report.exit_code == 0);
  CHECK(report.tensors == 25);
  std::string plan = out.str();
  // The report's bytes are the tensor data of every output rank, as the plan prints them.
  uint64_t printed = 0;
  for (std::size_t at = plan.find(" bytes of tensor data"); at != std::string::npos;
       at = plan.find(" bytes of tensor data", at + 1))
    printed += std::stoull(plan.substr(plan.rfind(", ", at) + 2, at - plan.rfind(", ", at) - 2));
  CHECK(report.bytes == printed);
  CHECK(printed > 980);  // rank 0 alone holds 980
  CHECK(contains(plan, "rank 0: model_rank0.pt, 13009 bytes"));
  CHECK(contains(plan, "optim_rank0.pt, 22957 bytes"));
  CHECK(contains(plan, "model.emb.weight [0:5, 0:4] <- source rank 0 [0:4, 0:4], source rank 1 [4:5, 0:4]"));
  CHECK(contains(report.summary, "(fsdp-sharded-tensor): 2 ranks"));
  CHECK_FALSE(std::filesystem::exists(req.output));
}

TEST_CASE("reshard of a full state dict without --layout is a usage error before anything is read", "[jobs]") {
  jobs::ReshardRequest req;
  req.common.source = testdata("pt/dtypes.pt");
  req.output = "unused";
  req.world_size = 2;
  std::ostringstream out;
  try {
    jobs::run_reshard(req, out);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK(contains(e.message(), "--layout dcp|hf|fsdp-sharded-tensor|fsdp-dtensor"));
  }
}

TEST_CASE("consolidate dry run lists every tensor with its source chunks", "[jobs]") {
  jobs::ConsolidateRequest req;
  req.common.source = testdata("dcp/fsdp2_adamw_ws3");
  req.common.dry_run = true;
  req.common.only = "model";
  req.output = "x.pt";
  std::ostringstream summary;
  jobs::JobReport report = jobs::run_consolidate(req, summary);
  CHECK(report.dry_run);
  CHECK(report.tensors == 7);  // the model: emb, fc1 (2), fc2 (2), scale, frozen
  CHECK(report.bytes == 4 * (40 + 32 + 8 + 56 + 7 + 2 + 16));
  CHECK(contains(summary.str(), "7 tensors from"));
  CHECK_FALSE(contains(summary.str(), "chunk(s)"));
  VerboseScope verbose;
  std::ostringstream out;
  jobs::run_consolidate(req, out);
  CHECK(contains(out.str(), "\n  emb.weight  float32 (10, 4) 160 B from 3 chunk(s)"));
  CHECK_FALSE(contains(out.str(), "optim."));
  CHECK_FALSE(contains(out.str(), "model."));
}

TEST_CASE("the common options are settled once into typed values", "[jobs]") {
  jobs::CommonOptions opt;
  opt.dtype = "bf16";
  opt.device = "cpu";
  opt.threads = 3;
  opt.memory_limit = "1G";
  opt.max_output_size = "2K";
  jobs::JobOptions job = jobs::settle(opt);
  CHECK(job.cast_to == DType::kBFloat16);
  CHECK(job.device == Device::kCpu);
  CHECK(job.threads == 3);
  CHECK(job.memory.total() == uint64_t{1} << 30);
  CHECK(job.max_output == 2048);
  CHECK(job.max_output_text == "2K");
  CHECK(!jobs::settle(jobs::CommonOptions{}).cast_to);
  CHECK(!jobs::settle(jobs::CommonOptions{}).max_output);
  for (auto bad : {&jobs::CommonOptions::dtype, &jobs::CommonOptions::device, &jobs::CommonOptions::memory_limit}) {
    jobs::CommonOptions wrong;
    wrong.*bad = "lots";
    try {
      jobs::settle(wrong);
      FAIL("accepted " << wrong.dtype << " " << wrong.device << " " << wrong.memory_limit);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kInvalidArgument);
    }
  }
}
