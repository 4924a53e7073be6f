#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/dcp_hf/dcp_hf_writer.h"
#include "formats/safetensors/safetensors_format.h"

using namespace ckpt;
using namespace ckpt::dcp_hf;

TEST_CASE("a rank's file is named and laid out as HuggingFaceStorageWriter writes it", "[formats][dcp_hf]") {
  std::vector<Piece> pieces = {{0, "scale", DType::kFloat32, {2}, {0}},  // an empty piece past the end
                               {1, "emb.weight", DType::kBFloat16, {4, 0}, {2, 3}},
                               {2, "fc.bias", DType::kFloat32, {4}, {2}}};
  safetensors::FilePlan file = plan_rank_file(2, pieces);
  CHECK(file.file_name == "shard-00003-model-00001-of-00001.safetensors");
  CHECK(file.header.size() % 8 == 0);
  // Data in safetensors' order: F32 before BF16 (its dtype enum, descending), then by name.
  REQUIRE(file.tensors.size() == 3);
  CHECK(file.tensors[0].name == "fc.bias");
  CHECK(file.tensors[1].name == "scale");
  CHECK(file.tensors[2].name == "emb.weight");
  CHECK(file.tensors[2].begin == 8);
  CHECK(file.tensors[2].end == 20);
  CHECK(file.data_size == 20);
  safetensors::Header h = safetensors::parse_header(file.header, file.data_size);
  CHECK(h.metadata.at("DCP_VERSION") == "1.0");
  CHECK(h.metadata.at("format") == "pt");
  // json.dumps of the pieces in item order, Python's separators.
  CHECK(h.metadata.at("DCP_SHARDING_INFO") ==
        R"({"scale": {"saved_offsets": [2]}, "emb.weight": {"saved_offsets": [4, 0]}, )"
        R"("fc.bias": {"saved_offsets": [4]}})");
}

TEST_CASE("sharding info escapes names as json.dumps does", "[formats][dcp_hf]") {
  safetensors::FilePlan file = plan_rank_file(0, {{0, "caf\xc3\xa9.\"w\"", DType::kFloat32, {0}, {1}}});
  safetensors::Header h = safetensors::parse_header(file.header, file.data_size);
  CHECK(h.metadata.at("DCP_SHARDING_INFO") == R"({"caf\u00e9.\"w\"": {"saved_offsets": [0]}})");
  CHECK(nlohmann::json::parse(h.metadata.at("DCP_SHARDING_INFO")).contains("caf\xc3\xa9.\"w\""));
}

TEST_CASE("a dtype safetensors lacks is refused naming the tensor", "[formats][dcp_hf]") {
  try {
    plan_rank_file(0, {{0, "odd", DType::kComplex128, {0}, {1}}});
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK(std::string(e.what()).find("'odd'") != std::string::npos);
  }
}
