#include <catch2/catch.hpp>

#include "core/error.h"
#include "formats/safetensors/safetensors_format.h"

using namespace ckpt;
using namespace ckpt::safetensors;

namespace {

// The message of the DataLoss error parse_header throws (fails the test otherwise).
std::string refusal(const std::string& json, uint64_t data_size) {
  try {
    parse_header(json, data_size);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    return e.what();
  }
  FAIL("header accepted: " << json);
  return "";
}

std::string file_with_header(const std::string& header, const std::string& data, uint64_t claimed) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(claimed >> (8 * i));
  return out + header + data;
}

const char* kTwo =
    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I8","shape":[2,2],"data_offsets":[8,12]}})";

}  // namespace

TEST_CASE("a valid header parses with dtypes, shapes, offsets and metadata", "[formats][safetensors]") {
  std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("s":{"dtype":"BF16","shape":[],"data_offsets":[8,10]},"e":{"dtype":"U8","shape":[0,3],"data_offsets":[10,10]}})";
  Header h = parse_header(json, 10);
  REQUIRE(h.tensors.size() == 3);
  CHECK(h.metadata.at("format") == "pt");
  CHECK(h.tensors[0].name == "a");
  CHECK(h.tensors[0].dtype == DType::kFloat32);
  CHECK(h.tensors[1].shape.empty());
  CHECK(h.tensors[1].dtype == DType::kBFloat16);
  CHECK(h.tensors[2].shape == Shape{0, 3});
}

TEST_CASE("corrupt headers are refused with a message naming the fault", "[formats][safetensors]") {
  SECTION("hole between tensors") {
    auto msg = refusal(
        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
        12);
    CHECK_THAT(msg, Catch::Contains("'b': hole in the data buffer before offset 8"));
  }
  SECTION("hole at the end of the buffer") {
    CHECK_THAT(refusal(kTwo, 16), Catch::Contains("4 bytes no tensor covers"));
  }
  SECTION("overlapping offsets") {
    auto msg = refusal(
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
        8);
    CHECK_THAT(msg, Catch::Contains("overlap"));
  }
  SECTION("offsets past the end of the data") {
    CHECK_THAT(refusal(kTwo, 10), Catch::Contains("data_offsets reach 12 but the data buffer has 10 bytes"));
  }
  SECTION("byte count disagreeing with shape and dtype") {
    auto msg = refusal(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
    CHECK_THAT(msg, Catch::Contains("'a': data_offsets hold 8 bytes, shape and dtype need 12"));
  }
  SECTION("end before begin") {
    CHECK_THAT(refusal(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4), Catch::Contains("end before"));
  }
  SECTION("unknown dtype") {
    CHECK_THAT(refusal(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16),
               Catch::Contains("unknown dtype 'F128'"));
  }
  SECTION("negative dimension") {
    CHECK_THAT(refusal(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
               Catch::Contains("non-negative"));
  }
  SECTION("shape whose byte count overflows") {
    auto msg = refusal(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
    CHECK_THAT(msg,
               Catch::Contains("safetensors tensor 'a': shape (4294967296, 4294967296) holds more than 2^64 bytes"));
  }
  SECTION("non-string metadata value") {
    CHECK_THAT(refusal(R"({"__metadata__":{"step":3}})", 0),
               Catch::Contains("__metadata__ value 'step' is not a string"));
  }
  SECTION("not JSON") { CHECK_THAT(refusal("{\"a\":", 0), Catch::Contains("not valid JSON")); }
  SECTION("JSON but not an object") { CHECK_THAT(refusal("[1,2]", 0), Catch::Contains("not a JSON object")); }
}

TEST_CASE("header lengths beyond the cap or the file are refused before reading", "[formats][safetensors]") {
  std::string header = kTwo;
  std::string data(12, '\0');
  uint64_t start = 0;
  SECTION("a well-formed file reads") {
    auto src = make_memory_source(file_with_header(header, data, header.size()), "ok.safetensors");
    CHECK(read_header(*src, start).tensors.size() == 2);
    CHECK(start == 8 + header.size());
    CHECK(looks_like_safetensors(*src));
  }
  SECTION("huge header length") {
    auto src = make_memory_source(file_with_header(header, data, uint64_t(1) << 60), "huge.safetensors");
    CHECK_THROWS_WITH(read_header(*src, start), Catch::Contains("exceeds the 100000000-byte limit"));
    CHECK(looks_like_safetensors(*src));  // detected as safetensors, then refused with this message
  }
  SECTION("header length larger than the file") {
    auto src = make_memory_source(file_with_header(header, data, header.size() + data.size() + 1), "long.safetensors");
    CHECK_THROWS_WITH(read_header(*src, start), Catch::Contains("is larger than the file"));
  }
  SECTION("file shorter than the length prefix") {
    CHECK_THROWS_AS(read_header(*make_memory_source("abc", "tiny"), start), Error);
  }
}

TEST_CASE("dtype codes follow the safetensors names and refuse what it lacks", "[formats][safetensors]") {
  CHECK(dtype_code(DType::kBFloat16) == "BF16");
  CHECK(dtype_code(DType::kFloat8E4M3FN) == "F8_E4M3");
  CHECK(dtype_code(DType::kComplex64) == "C64");
  CHECK_FALSE(dtype_code(DType::kComplex128));
  CHECK(dtype_code(DType::kFloat8E4M3FNUZ) == "F8_E4M3FNUZ");  // safetensors 0.8 has the FNUZ pair
  CHECK(dtype_sort_rank(DType::kFloat8E5M2FNUZ) > dtype_sort_rank(DType::kFloat8E8M0FNU));
  CHECK(dtype_sort_rank(DType::kInt16) > dtype_sort_rank(DType::kFloat8E5M2FNUZ));
  // The writer's order: U64 first, BOOL last (safetensors sorts its Dtype enum descending).
  CHECK(dtype_sort_rank(DType::kUInt64) > dtype_sort_rank(DType::kFloat64));
  CHECK(dtype_sort_rank(DType::kFloat32) > dtype_sort_rank(DType::kUInt32));
  CHECK(dtype_sort_rank(DType::kBool) == 0);
  CHECK(dtype_code(DType::kFloat4E2M1FNx2) == "F4");
  CHECK(dtype_sort_rank(DType::kFloat4E2M1FNx2) == 1);  // after BOOL, before U8 (read off save_file)
}

TEST_CASE("F4 shapes count values, torch's float4_e2m1fn_x2 bytes", "[formats][safetensors]") {
  Header h = parse_header(R"({"w":{"dtype":"F4","shape":[2,6],"data_offsets":[0,6]}})", 6);
  REQUIRE(h.tensors.size() == 1);
  CHECK(h.tensors[0].dtype == DType::kFloat4E2M1FNx2);
  CHECK(h.tensors[0].shape == Shape{2, 3});
  CHECK(header_shape("w", DType::kFloat4E2M1FNx2, {2, 3}) == Shape{2, 6});
  CHECK(header_shape("w", DType::kFloat8E4M3FN, {2, 3}) == Shape{2, 3});
  CHECK_THROWS_AS(header_shape("s", DType::kFloat4E2M1FNx2, {}), Error);
  CHECK_THAT(refusal(R"({"w":{"dtype":"F4","shape":[2,5],"data_offsets":[0,5]}})", 5),
             Catch::Contains("'w'") && Catch::Contains("odd last dimension"));
  CHECK_THAT(refusal(R"({"w":{"dtype":"F4","shape":[],"data_offsets":[0,1]}})", 1),
             Catch::Contains("has no dimension"));
  // the byte count follows the torch shape: [2, 6] values are 6 bytes, not 12
  CHECK_THAT(refusal(R"({"w":{"dtype":"F4","shape":[2,6],"data_offsets":[0,12]}})", 12),
             Catch::Contains("shape and dtype need 6"));
}

TEST_CASE("FP6 is refused as having no torch dtype, not as unknown", "[formats][safetensors]") {
  for (const char* code : {"F6_E2M3", "F6_E3M2"}) {
    std::string json = std::string(R"({"w":{"dtype":")") + code + R"(","shape":[4],"data_offsets":[0,3]}})";
    try {
      parse_header(json, 3);
      FAIL("FP6 accepted: " << json);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kUnimplemented);  // exit 3, as unsupported input
      CHECK_THAT(e.what(), Catch::Contains(std::string(code) + " (FP6) has no torch dtype") && Catch::Contains("'w'"));
      CHECK_THAT(e.what(), !Catch::Contains("unknown dtype"));
    }
  }
}
