// The writer conformance suite: every registered output format
// (exec/write_output.h output_formats()) writes the same model, and the
// readers that read that format give it back, tensors and values equal at
// zero tolerance (bytes are copied, never recomputed); a format that shards
// does so too. The real libraries' view of these files (torch.load, h5py,
// safetensors) is tested in the pytest suite.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "diff/checkpoint_diff.h"
#include "exec/parted_output.h"
#include "exec/write_output.h"
#include "formats/detect.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

fs::path scratch() {
  fs::path dir = fs::temp_directory_path() / ("ckptconv-writers-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

SourceKind kind_read_as(OutputFormat f, bool sharded) {
  switch (f) {
    case OutputFormat::kPt: return SourceKind::kTorchPt;
    case OutputFormat::kSafetensors: return sharded ? SourceKind::kSafetensorsIndex : SourceKind::kSafetensors;
    case OutputFormat::kHdf5: return SourceKind::kHdf5;
  }
  return SourceKind::kTorchPt;
}

}  // namespace

TEST_CASE("every output format writes a model its readers give back equal", "[exec][writers][conformance]") {
  fs::path dir = scratch();
  CheckpointModel model = read_checkpoint(testdata("dcp/fsdp2_adamw_ws2"));
  for (const OutputFormatInfo& f : output_formats()) {
#ifndef CKPT_HAVE_HDF5
    if (f.id == OutputFormat::kHdf5) continue;
#endif
    for (bool sharded : {false, true}) {
      if (sharded && !f.shards) continue;
      INFO(std::string(f.name) << (sharded ? " sharded" : ""));
      OutputOptions options;
      options.path = (dir / ((sharded ? "sharded" : "whole") + std::string(f.extensions.front()))).string();
      options.durable = false;
      options.max_shard_size = sharded ? 300 : 0;
      std::vector<std::string> files = write_output(model, f.id, options);
      REQUIRE_FALSE(files.empty());
      for (const auto& file : files) CHECK(fs::is_regular_file(file));
      // what a user names to read it back: OUT, or the index of the shards
      std::string read_back = files.back();
      CHECK(read_back == (sharded ? options.path + ".index.json" : options.path));
      if (sharded) CHECK(files.size() > 2);
      CheckpointModel back = read_checkpoint(read_back);
      CHECK(back.info.kind == kind_read_as(f.id, sharded));
      DiffReport diff = diff_models(back, model, {});
      CHECK(diff.tensors.size() == model.tensors.size());
      CHECK(diff.only_in_a.empty());
      CHECK(diff.only_in_b.empty());
      CHECK(diff.equal());
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("output formats are found by every name and extension they list", "[exec][writers]") {
  for (const OutputFormatInfo& f : output_formats()) {
    CHECK(output_format_from_name(std::string(f.name)) == f.id);
    for (auto alias : f.aliases) CHECK(output_format_from_name(std::string(alias)) == f.id);
    for (auto ext : f.extensions) {
      CHECK(output_format_from_path("out" + std::string(ext)) == f.id);
      std::string upper = "OUT" + std::string(ext);
      for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      CHECK(output_format_from_path(upper) == f.id);
    }
    CHECK(output_format_from_path("out/" + std::string(f.weights_file)) == f.id);
    CHECK(output_format_from_path("out/" + std::string(f.full_file)) == f.id);
    CHECK(std::string(output_format_name(f.id)) == f.name);
    CHECK(output_extensions_text().find(std::string(f.extensions.front())) != std::string::npos);
  }
  CHECK_FALSE(output_format_from_name("safetensor"));
  CHECK_FALSE(output_format_from_path("out.safetensor"));
}

// The parted driver (exec/parted_output.h) over each format's PartedWriter:
// three workers, run one after another here as three processes would, give
// the same bytes as the one-process writer; the last to finish publishes.
TEST_CASE("every format that takes --part writes the one-process bytes from its parts", "[exec][writers][parts]") {
  fs::path dir = scratch();
  CheckpointModel model = read_checkpoint(testdata("dcp/fsdp2_adamw_ws2"));
  std::size_t formats = 0;
  for (const OutputFormatInfo& f : output_formats()) {
    if (!f.parted) continue;
    ++formats;
    for (bool sharded : {false, true}) {
      if (sharded && !f.shards) continue;
      INFO(std::string(f.name) << (sharded ? " sharded" : ""));
      std::string name = (sharded ? "sharded" : "whole") + std::string(f.extensions.front());
      OutputOptions whole;
      whole.path = (dir / "one" / name).string();
      whole.durable = false;
      whole.max_shard_size = sharded ? 300 : 0;
      fs::create_directories(dir / "one");
      std::vector<std::string> expected = write_output(model, f.id, whole);
      OutputOptions parted = whole;
      parted.path = (dir / "parts" / name).string();
      fs::create_directories(dir / "parts");
      for (int i = 0; i < 3; ++i) {
        PartOutcome done = write_output_part(model, f.id, parted, {i, 3, false, "test"}, "{}");
        CHECK(done.published == (i == 2));
        if (i < 2)
          for (const auto& file : expected) CHECK_FALSE(fs::exists(dir / "parts" / fs::path(file).filename()));
      }
      for (const auto& file : expected) {
        INFO(file);
        CHECK(bytes_of((dir / "parts" / fs::path(file).filename()).string()) == bytes_of(file));
      }
    }
  }
  CHECK(formats >= 2);  // .pt and .safetensors
  fs::remove_all(dir);
}
