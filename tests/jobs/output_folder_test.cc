#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "jobs/output_folder.h"

using namespace ckpt;
using namespace ckpt::jobs;
namespace fs = std::filesystem;

namespace {

struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("ckptconv-output-folder-" + std::to_string(::getpid()));
  Scratch() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  void touch(const std::string& name) const { std::ofstream(dir / name) << name; }
};

}  // namespace

TEST_CASE("a weights file's family is the file, its shards and its index", "[jobs][output_folder]") {
  Scratch s;
  for (const char* name : {"model.safetensors", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json", "model-1-of-2.safetensors", "model-00001-of-00002.bin",
                           "full.safetensors", "config.json", "xmodel-00001-of-00002.safetensors"})
    s.touch(name);
  CHECK(file_family_in(s.dir.string(), "model.safetensors") ==
        std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                 "model.safetensors", "model.safetensors.index.json"});
  CHECK(file_family_in(s.dir.string(), "pytorch_model.bin").empty());
  CHECK(file_family_in(s.dir.string(), "full.safetensors") == std::vector<std::string>{"full.safetensors"});
}

TEST_CASE("an existing model in the folder is refused without --force, before anything is made",
          "[jobs][output_folder]") {
  Scratch s;
  s.touch("model-00001-of-00003.safetensors");
  try {
    OutputFolder folder(s.dir.string() + "/", "model.safetensors", false, false);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK(std::string(e.what()).find("model-00001-of-00003.safetensors: output exists") != std::string::npos);
  }
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(s.dir.parent_path()))
    entries += e.path().filename().string().rfind(s.dir.filename().string() + ".tmp-", 0) == 0 ? 1 : 0;
  CHECK(entries == 0);
}

TEST_CASE("a new folder is staged beside it and appears on publish", "[jobs][output_folder]") {
  Scratch s;
  fs::path target = s.dir / "a" / "b";
  {
    OutputFolder folder(target.string(), "model.safetensors", false, false);
    CHECK(fs::path(folder.file_path()).parent_path() != target);
    CHECK(folder.published_path(folder.file_path()) == (target / "model.safetensors").string());
    std::ofstream(folder.file_path()) << "weights";
    CHECK(!fs::exists(target));
    folder.publish({}, ConfigEdits{});
  }
  CHECK(fs::exists(target / "model.safetensors"));
  { OutputFolder abandoned((s.dir / "c" / "d").string(), "model.safetensors", false, false); }
  CHECK(!fs::exists(s.dir / "c"));  // made for the job, removed with it
}
