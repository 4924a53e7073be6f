#include "model/ordered_json.h"

#include <catch2/catch.hpp>
#include <string>

#include "core/error.h"

using namespace ckpt;
using Json = nlohmann::ordered_json;

TEST_CASE("ordered JSON parse keeps member order, nesting and every value kind", "[model]") {
  Json j = parse_ordered_json(R"({"z": 1, "a": [true, null, -2, 3.5, "s"], "m": {"y": {}, "b": []}})", 8, "test");
  REQUIRE(j.is_object());
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys += it.key();
  CHECK(keys == "zam");
  CHECK(j["a"] == Json::parse(R"([true, null, -2, 3.5, "s"])"));
  CHECK(j["m"].begin().key() == "y");
  CHECK(j.dump() == R"({"z":1,"a":[true,null,-2,3.5,"s"],"m":{"y":{},"b":[]}})");
}

TEST_CASE("ordered JSON parse refuses bad JSON and deep nesting naming what it parsed", "[model]") {
  try {
    parse_ordered_json(R"({"a": )", 8, "safetensors header");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK(std::string(e.what()).rfind("safetensors header is not valid JSON", 0) == 0);
  }
  std::string deep(100, '[');
  deep += std::string(100, ']');
  CHECK_NOTHROW(parse_ordered_json(deep, 100, "x"));
  CHECK_THROWS_AS(parse_ordered_json(deep, 99, "x"), Error);
}

TEST_CASE("a NUL byte anywhere is refused, not taken for the end of the text", "[model]") {
  // nlohmann's lexer ends its input at a NUL: '{"a": 1}\0{"b"' parsed as {"a": 1}.
  using namespace std::string_literals;
  for (const std::string& text : {"{\"a\": 1}\0\0"s, "{\"a\": 1}\0{\"b\": 2}"s, "\0{\"a\": 1}"s}) {
    try {
      parse_ordered_json(text, 8, "the index");
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kDataLoss);
      CHECK(std::string(e.what()).rfind("the index is not valid JSON: a NUL byte at offset", 0) == 0);
    }
  }
  CHECK(parse_ordered_json("{\"a\": \"\\u0000\"} \n", 8, "x")["a"] == std::string(1, '\0'));  // escaped: a string's NUL
}

TEST_CASE("duplicate keys are all kept by the parse; the builder keeps the last value in the first place", "[model]") {
  Json j = parse_ordered_json(R"({"w": 1, "w": 2})", 4, "x");
  CHECK(j.size() == 2);
  OrderedObjectBuilder b;
  b.set("a", 1);
  b.set("b", 2);
  b.set("a", 3);
  CHECK(b.get().dump() == R"({"a":3,"b":2})");
}
