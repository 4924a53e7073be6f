#include <catch2/catch.hpp>

#include "check/manifest.h"
#include "core/error.h"

using namespace ckpt;
using namespace ckpt::check;

namespace {
Manifest sample() {
  Manifest m;
  m.source = "ckpt";
  m.format = "dcp";
  m.world_size = 2;
  m.files = {{".metadata", 10, "aa"}, {"__0_0.distcp", 100, "bb"}, {"__1_0.distcp", 100, "cc"}};
  m.tensors = {{"model.w", "float32", {7, 8}, "11"}, {"model.b", "float32", {7}, "22"}};
  return m;
}
}  // namespace

TEST_CASE("a manifest round-trips through JSON", "[check]") {
  Manifest m = sample();
  m.algorithm = ChecksumAlgorithm::kSha256;
  Manifest back = manifest_from_json(manifest_to_json(m), "m.json");
  CHECK(back.algorithm == ChecksumAlgorithm::kSha256);
  CHECK(back.files.size() == 3);
  CHECK(back.files[1].path == "__0_0.distcp");
  CHECK(back.tensors[0].shape == Shape{7, 8});
  CHECK(manifest_to_json(back) == manifest_to_json(m));
}

TEST_CASE("JSON that is not a manifest of this version is refused", "[check]") {
  auto j = manifest_to_json(sample());
  j["schema_version"] = 2;
  CHECK_THROWS_WITH(manifest_from_json(j, "m.json"), Catch::Contains("schema_version 2"));
  CHECK_THROWS_WITH(manifest_from_json(nlohmann::ordered_json::object(), "m.json"),
                    Catch::Contains("not a ckptconv manifest"));
}

TEST_CASE("comparison names every changed, missing and new file and tensor", "[check]") {
  Manifest now = sample();
  now.files[1].checksum = "bX";
  now.files.erase(now.files.begin() + 2);
  now.files.push_back({"__2_0.distcp", 5, "dd"});
  now.tensors[0].checksum = "1X";
  now.tensors[1].shape = {8};
  now.tensors.push_back({"model.extra", "float32", {1}, "33"});
  ProblemSink sink;
  ManifestComparison c = compare_manifests(sample(), now, "m.json", sink);
  CHECK(c.files_compared);
  CHECK(c.changed == 3);
  CHECK(c.missing == 1);
  CHECK(c.added == 2);
  std::vector<std::string> messages;
  for (const auto& p : sink.problems()) messages.push_back(p.message);
  CHECK_THAT(messages[0], Catch::StartsWith("file '__0_0.distcp' changed since the manifest m.json was written"));
  CHECK(messages[1] == "file '__1_0.distcp' is in the manifest m.json but not in the checkpoint");
  CHECK(messages[2] == "file '__2_0.distcp' is not in the manifest m.json");
  CHECK_THAT(messages[3], Catch::StartsWith("tensor 'model.w' changed since the manifest m.json was written"));
  CHECK(messages[4] == "tensor 'model.b' was float32 (7,) when the manifest m.json was written, now float32 (8,)");
  CHECK(messages[5] == "tensor 'model.extra' is not in the manifest m.json");
  CHECK(sink.problems()[3].tensor == "model.w");
}

TEST_CASE("files are not compared across layouts; tensors are", "[check]") {
  Manifest now = sample();
  now.format = "pt";
  now.world_size = 1;
  now.files = {{"full.pt", 300, "ee"}};
  ProblemSink sink;
  ManifestComparison c = compare_manifests(sample(), now, "m.json", sink);
  CHECK_FALSE(c.files_compared);
  CHECK_THAT(c.note, Catch::Contains("files not compared"));
  CHECK(sink.problems().empty());
}
