// The input-format registry (formats/registry.h): one descriptor per source
// kind, and detection by the highest confidence, whatever the order.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "formats/detect.h"
#include "formats/registry.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("ckptconv-registry-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "x";
}

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

}  // namespace

TEST_CASE("every source kind has one registered input format", "[formats][registry]") {
  std::set<SourceKind> seen;
  for (const InputFormat* f : input_formats()) {
    INFO(source_kind_name(f->kind));
    CHECK(seen.insert(f->kind).second);
    CHECK(f->read != nullptr);
    CHECK((f->probe_directory != nullptr || f->probe_file != nullptr));
    CHECK(&input_format(f->kind) == f);
    CHECK(&source_traits(f->kind) == &f->traits);
  }
  for (SourceKind k : {SourceKind::kTorchPt, SourceKind::kDcpDir, SourceKind::kFsdpRanks, SourceKind::kSafetensors,
                       SourceKind::kSafetensorsIndex, SourceKind::kHdf5, SourceKind::kZero, SourceKind::kDcpPair,
                       SourceKind::kHfFolder, SourceKind::kDcpHf, SourceKind::kDsUniversal, SourceKind::kMegatron,
                       SourceKind::kHfBinFolder, SourceKind::kMegatronLegacy})
    CHECK(seen.count(k) == 1);
}

TEST_CASE("a directory is the format whose probe is most confident", "[formats][registry]") {
  // A marker file beats file names: a DCP directory holding *rank* files.
  fs::path dcp = fresh_dir("dcp");
  fs::copy(testdata("dcp/fsdp2_adamw_ws2"), dcp, fs::copy_options::recursive);
  touch(dcp / "model_rank0.pt");
  touch(dcp / "model_rank1.pt");
  CHECK(directory_kind(dcp.string()) == SourceKind::kDcpDir);

  // File names beat a checkpoint nested inside: per-rank files beside an
  // Accelerate model directory are the per-rank checkpoint.
  fs::path ranks = fresh_dir("ranks");
  touch(ranks / "pytorch_model_fsdp_0" / ".metadata");
  CHECK(directory_kind(ranks.string()) == SourceKind::kDcpPair);
  touch(ranks / "model_rank0.pt");
  touch(ranks / "model_rank1.pt");
  CHECK(directory_kind(ranks.string()) == SourceKind::kFsdpRanks);

  // DeepSpeed's `latest` and tag folder beat rank-named files.
  fs::path zero = fresh_dir("zero");
  fs::copy(testdata("zero/z2_bf16_ws2"), zero, fs::copy_options::recursive);
  touch(zero / "optim_rank0.pt");
  CHECK(directory_kind(zero.string()) == SourceKind::kZero);

  // Hugging Face folders: an index beats rank-named files, loose
  // .safetensors files do not; a DCP .metadata beats both.
  fs::path hf = fresh_dir("hf");
  touch(hf / "model_rank0.pt");
  touch(hf / "model_rank1.pt");
  touch(hf / "model.safetensors");
  CHECK(directory_kind(hf.string()) == SourceKind::kFsdpRanks);
  touch(hf / "model.safetensors.index.json");
  CHECK(directory_kind(hf.string()) == SourceKind::kHfFolder);
  touch(hf / ".metadata");
  CHECK(directory_kind(hf.string()) == SourceKind::kDcpDir);
  fs::remove_all(hf);

  // pytorch_model.bin weights are read when there are no safetensors ones;
  // a PEFT adapter alone is an HF folder whose reader names the file to pass.
  fs::path bin = fresh_dir("hf-bin");
  touch(bin / "pytorch_model-00001-of-00002.bin");
  CHECK(directory_kind(bin.string()) == SourceKind::kHfBinFolder);
  touch(bin / "model.safetensors");
  CHECK(directory_kind(bin.string()) == SourceKind::kHfFolder);
  fs::path adapter = fresh_dir("hf-adapter");
  touch(adapter / "adapter_model.safetensors");
  CHECK(directory_kind(adapter.string()) == SourceKind::kHfFolder);
  touch(adapter / "pytorch_model.bin");
  CHECK(directory_kind(adapter.string()) == SourceKind::kHfBinFolder);
  CHECK(directory_kind(testdata("hf/llama_tied_bin")) == SourceKind::kHfBinFolder);

  // torch's DCP Hugging Face files refine a Hugging Face folder.
  CHECK(directory_kind(testdata("dcp_hf/fsdp2_ws3")) == SourceKind::kDcpHf);
  // A universal checkpoint's tag folder holds DeepSpeed's model-states file
  // too: the refinement wins over ZeRO's marker, and its root is one by latest_universal.
  CHECK(directory_kind(testdata("ucp/z2_bf16_ws2/global_step3_universal")) == SourceKind::kDsUniversal);
  CHECK(directory_kind(testdata("ucp/z3_bf16_ws2")) == SourceKind::kDsUniversal);
  CHECK(directory_kind(testdata("zero/z2_bf16_ws2")) == SourceKind::kZero);
  CHECK(directory_kind(testdata("dcp_hf/fsdp2_ws2_consolidated")) == SourceKind::kHfFolder);
  CHECK(directory_kind(testdata("dcp_hf/fsdp2_ws2_consolidated/sharded")) == SourceKind::kDcpHf);
  // A Megatron-core torch_dist directory is a DCP directory with metadata.json.
  fs::path mcore = fresh_dir("mcore");
  fs::copy(testdata("megatron/gpt_tp1pp2/ckpt"), mcore, fs::copy_options::recursive);
  CHECK(directory_kind(mcore.string()) == SourceKind::kMegatron);
  fs::remove(mcore / "metadata.json");
  CHECK(directory_kind(mcore.string()) == SourceKind::kDcpDir);
  fs::remove_all(mcore);

  // None: the message names what each directory format would have shown.
  fs::path none = fresh_dir("none");
  touch(none / "notes.txt");
  CHECK_FALSE(directory_kind(none.string()));
  try {
    detect_source(none.string());
    FAIL("an unknown directory was detected");
  } catch (const Error& e) {
    std::string what = e.what();
    for (const InputFormat* f : input_formats())
      if (!f->directory_shape.empty()) CHECK(what.find(std::string(f->directory_shape)) != std::string::npos);
  }
  for (const auto& d : {dcp, ranks, zero, none}) fs::remove_all(d);
}

TEST_CASE("a file is the format whose probe is most confident", "[formats][registry]") {
  CHECK(detect_source(testdata("pt/dtypes.pt")) == SourceKind::kTorchPt);
  CHECK(detect_source(testdata("zero/z2_bf16_ws2/reference_fp32.pt")) == SourceKind::kTorchPt);
  fs::path dir = fresh_dir("files");
  std::ofstream(dir / "x.safetensors", std::ios::binary).write("\x02\0\0\0\0\0\0\0{}", 10);
  CHECK(detect_source((dir / "x.safetensors").string()) == SourceKind::kSafetensors);
  std::ofstream(dir / "junk.bin") << "not a checkpoint";
  CHECK_THROWS_AS(detect_source((dir / "junk.bin").string()), Error);
  fs::remove_all(dir);
}
