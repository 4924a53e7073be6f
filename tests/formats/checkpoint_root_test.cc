#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <unistd.h>

#include "core/error.h"
#include "formats/checkpoint_root.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

// A folder of fake saves: only the file names matter to the root listing.
struct Root {
  fs::path dir = fs::temp_directory_path() / ("ckptconv-root-" + std::to_string(::getpid()));
  Root() {
    fs::remove_all(dir);
    for (const char* step : {"step-100", "step-20", "step-300"}) {
      fs::create_directories(dir / step);
      touch(dir / step / "__0_0.distcp");
      touch(dir / step / "__1_0.distcp");
      if (std::string(step) != "step-300") touch(dir / step / ".metadata");  // step-300 never finished
    }
    fs::create_directories(dir / "logs");  // not a checkpoint
  }
  ~Root() { fs::remove_all(dir); }
  static void touch(const fs::path& p) { std::ofstream(p) << "x"; }
  std::string path(const std::string& name = "") const { return name.empty() ? dir.string() : (dir / name).string(); }
};

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;
}

}  // namespace

TEST_CASE("a root lists its checkpoints by step with incomplete ones marked", "[formats][root]") {
  Root root;
  auto entries = list_checkpoints(root.path());
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].name == "step-20");
  CHECK(entries[1].name == "step-100");
  CHECK(entries[2].name == "step-300");
  CHECK(entries[0].complete);
  CHECK_FALSE(entries[2].complete);
  CHECK(entries[1].world_size == 2);
  CHECK(*entries[1].step == 100);
  CHECK(is_checkpoint_root(root.path()));
  CHECK_FALSE(is_checkpoint_root(root.path("step-20")));
}

TEST_CASE("a tag chooses a checkpoint and latest is the highest complete one or the one the file names",
          "[formats][root]") {
  Root root;
  CHECK(resolve_checkpoint(root.path(), "latest") == root.path("step-100"));
  CHECK(resolve_checkpoint(root.path(), "step-20") == root.path("step-20"));
  CHECK(code_of([&] { resolve_checkpoint(root.path(), ""); }) == ErrorCode::kInvalidArgument);
  CHECK(code_of([&] { resolve_checkpoint(root.path(), "step-300"); }) == ErrorCode::kDataLoss);
  CHECK(code_of([&] { resolve_checkpoint(root.path(), "step-7"); }) == ErrorCode::kNotFound);
  CHECK(code_of([&] { resolve_checkpoint(root.path(), "../x"); }) == ErrorCode::kInvalidArgument);
  CHECK(code_of([&] { resolve_checkpoint(root.path("step-20"), "latest"); }) == ErrorCode::kInvalidArgument);
  std::ofstream(root.dir / "latest") << "step-20\n";
  CHECK(resolve_checkpoint(root.path(), "latest") == root.path("step-20"));
  CHECK(resolve_checkpoint(root.path("step-20"), "") == root.path("step-20"));
}
