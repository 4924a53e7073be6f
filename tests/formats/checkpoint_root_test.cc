#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <unistd.h>

#include "core/error.h"
#include "formats/checkpoint_root.h"
#include "formats/detect.h"

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
  // No --tag: the latest complete one, as --tag latest, with why (the
  // incomplete last step named as skipped).
  ChosenCheckpoint untagged = choose_checkpoint(root.path(), "");
  CHECK(untagged.path == root.path("step-100"));
  CHECK_THAT(untagged.why, Catch::Contains("no --tag") && Catch::Contains("step-300 is incomplete"));
  CHECK(code_of([&] { resolve_checkpoint(root.path(), "step-300"); }) == ErrorCode::kDataLoss);
  CHECK(code_of([&] { resolve_checkpoint(root.path(), "step-7"); }) == ErrorCode::kNotFound);
  CHECK(code_of([&] { resolve_checkpoint(root.path(), "../x"); }) == ErrorCode::kInvalidArgument);
  CHECK(code_of([&] { resolve_checkpoint(root.path("step-20"), "latest"); }) == ErrorCode::kInvalidArgument);
  std::ofstream(root.dir / "latest") << "step-20\n";
  CHECK(resolve_checkpoint(root.path(), "latest") == root.path("step-20"));
  CHECK(resolve_checkpoint(root.path("step-20"), "") == root.path("step-20"));
}

// A DeepSpeed root with ZeRO tags and a universal tag side by side, as a
// job leaves it after `reshard ROOT --tag global_step10 -o
// ROOT/global_step10_universal --layout deepspeed-universal` (#47): the
// names are what decides (fake files).
TEST_CASE("a DeepSpeed root reads what latest names, and --tag what it names, of either kind", "[formats][root]") {
  Root root;
  fs::remove_all(root.dir);
  for (const char* tag : {"global_step10", "global_step20"}) {
    fs::create_directories(root.dir / tag);
    Root::touch(root.dir / tag / "mp_rank_00_model_states.pt");
    Root::touch(root.dir / tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  }
  fs::create_directories(root.dir / "global_step10_universal" / "zero");
  Root::touch(root.dir / "global_step10_universal" / "mp_rank_00_model_states.pt");
  Root::touch(root.dir / "global_step10_universal" / "zero" / "optimizer_state.pt");
  std::ofstream(root.dir / "latest") << "global_step20";
  std::ofstream(root.dir / "latest_universal") << "global_step10_universal";

  CHECK(directory_kind(root.path()) == SourceKind::kZero);  // latest_universal does not take the root over
  ChosenCheckpoint none = choose_checkpoint(root.path(), "");
  CHECK(none.path == root.path("global_step20"));
  CHECK(none.why.find("`latest` names") != std::string::npos);
  CHECK(none.why.find("--tag latest_universal") != std::string::npos);
  CHECK(resolve_checkpoint(root.path(), "latest") == root.path("global_step20"));
  CHECK(resolve_checkpoint(root.path(), "global_step10") == root.path("global_step10"));
  CHECK(resolve_checkpoint(root.path(), "global_step10_universal") == root.path("global_step10_universal"));
  CHECK(resolve_checkpoint(root.path(), "latest_universal") == root.path("global_step10_universal"));
  CHECK(choose_checkpoint(root.path(), "global_step10").why == "--tag global_step10");
  CHECK(code_of([&] { resolve_checkpoint(root.path(), "global_step30"); }) == ErrorCode::kNotFound);
  CHECK(code_of([&] { resolve_checkpoint(root.path(), "../x"); }) == ErrorCode::kInvalidArgument);
  CHECK(code_of([&] { resolve_checkpoint(root.path("global_step20"), "global_step10"); }) ==
        ErrorCode::kInvalidArgument);

  auto entries = list_checkpoints(root.path());
  REQUIRE(entries.size() == 3);
  CHECK(entries[1].name == "global_step10_universal");
  CHECK(entries[1].kind == "deepspeed-universal");
  CHECK(entries[1].complete);
  CHECK(entries[1].latest_universal);
  CHECK(entries[2].latest);
  CHECK_FALSE(entries[2].latest_universal);

  // `latest` naming a tag that is not there: exit 3, never the universal tag instead.
  std::ofstream(root.dir / "latest", std::ios::trunc) << "global_step30";
  CHECK(code_of([&] { resolve_checkpoint(root.path(), ""); }) == ErrorCode::kNotFound);
  CHECK(code_of([&] { resolve_checkpoint(root.path(), "latest"); }) == ErrorCode::kNotFound);
  // No `latest`: the root is the universal checkpoint latest_universal names.
  fs::remove(root.dir / "latest");
  CHECK(directory_kind(root.path()) == SourceKind::kDsUniversal);
  CHECK(resolve_checkpoint(root.path(), "") == root.path("global_step10_universal"));
  CHECK(resolve_checkpoint(root.path(), "latest") == root.path("global_step20"));  // the highest complete step
}
