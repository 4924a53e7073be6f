// validate (check/validate.h) on real-torch fixtures: what a sound
// checkpoint reports, and a damaged copy's problems naming file and rank.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "check/validate.h"

using namespace ckpt;
using namespace ckpt::check;
namespace fs = std::filesystem;

namespace {

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

struct Copy {
  fs::path dir = fs::temp_directory_path() / ("ckptconv-validate-" + std::to_string(::getpid()));
  explicit Copy(const std::string& from) {
    fs::remove_all(dir);
    fs::copy(from, dir, fs::copy_options::recursive);
  }
  ~Copy() { fs::remove_all(dir); }
};

}  // namespace

TEST_CASE("a sound DCP checkpoint validates with the totals its metadata declares", "[check][validate]") {
  ValidateOptions options;
  options.expect_world_size = 2;
  ValidateReport r = validate_checkpoint(testdata("dcp/fsdp2_adamw_ws2"), options);
  CHECK(r.exit_code() == 0);
  CHECK(r.problems.empty());
  CHECK(r.readable);
  CHECK(r.format == "dcp");
  CHECK(r.world_size == 2);
  CHECK(r.files == 3);  // two .distcp and .metadata
  CHECK(r.files_missing == 0);
  CHECK(r.tensors > 0);
  CHECK(r.tensors_unread == 0);
}

TEST_CASE("a truncated rank file is a problem naming the file and its rank", "[check][validate]") {
  Copy copy(testdata("dcp/fsdp2_adamw_ws2"));
  fs::path victim = copy.dir / "__1_0.distcp";
  fs::resize_file(victim, fs::file_size(victim) / 2);
  ValidateReport r = validate_checkpoint(copy.dir.string(), {});
  CHECK(r.exit_code() == 1);
  REQUIRE_FALSE(r.problems.empty());
  bool named = false;
  for (const auto& p : r.problems) named |= p.file.find("__1_0.distcp") != std::string::npos && p.rank == 1;
  CHECK(named);
}

TEST_CASE("another world size than expected is its own kind of problem", "[check][validate]") {
  ValidateOptions options;
  options.expect_world_size = 4;
  ValidateReport r = validate_checkpoint(testdata("dcp/fsdp2_adamw_ws2"), options);
  CHECK(r.exit_code() == 1);
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].kind == "WorldSize");
}

TEST_CASE("a missing source is unreadable, exit 3", "[check][validate]") {
  ValidateReport r = validate_checkpoint(testdata("dcp/no-such-checkpoint"), {});
  CHECK_FALSE(r.readable);
  CHECK(r.exit_code() == 3);
}
