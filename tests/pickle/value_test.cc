#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "pickle/encodings.h"
#include "pickle/value.h"

using namespace ckpt;
using namespace ckpt::pickle;

TEST_CASE("accessors name the expected and the actual kind", "[pickle]") {
  ValuePtr s = Value::str("x");
  try {
    s->as_int();
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK(e.message() == "expected int in pickle, found str");
  }
  CHECK_THROWS_WITH(Value::integer(1)->as_str(), "expected str in pickle, found int");
  CHECK_THROWS_WITH(Value::none()->as_sequence(), "expected tuple or list in pickle, found None");
  CHECK_THROWS_WITH(Value::list({})->get("k"), "expected dict in pickle, found list");
  CHECK(Value::integer(3)->as_number() == 3.0);
  CHECK(Value::floating(0.5)->as_number() == 0.5);
}

TEST_CASE("dict lookup by string key, the last of duplicate keys wins", "[pickle]") {
  ValuePtr d = Value::dict({{Value::str("a"), Value::integer(1)},
                            {Value::integer(5), Value::integer(2)},
                            {Value::str("a"), Value::integer(3)}});
  CHECK(d->get("a")->as_int() == 3);
  CHECK(d->get("b") == nullptr);
  CHECK_THROWS_WITH(d->at("b"), "dict in pickle has no key 'b'");
}

TEST_CASE("repr is Python-like", "[pickle]") {
  ValuePtr v = Value::dict({{Value::str("lr"), Value::floating(0.01)},
                            {Value::str("params"), Value::list({Value::integer(0), Value::integer(1)})},
                            {Value::str("t"), Value::tuple({Value::boolean(true)})},
                            {Value::str("b"), Value::bytes(std::string("\x00'", 2))},
                            {Value::str("f"), Value::floating(2.0)},
                            {Value::str("n"), Value::none()}});
  CHECK(v->repr() == "{'lr': 0.01, 'params': [0, 1], 't': (True,), 'b': b'\\x00\\'', 'f': 2.0, 'n': None}");
  ValuePtr call = Value::call(Value::global("torch", "Size"), Value::tuple({Value::list({Value::integer(2)})}));
  CHECK(call->repr() == "torch.Size([2])");
  CHECK(Value::big_integer(decimal_to_twos_complement("-99999999999999999999"))->repr() == "-99999999999999999999");
}

TEST_CASE("repr is bounded in items, depth and length", "[pickle]") {
  std::vector<ValuePtr> items;
  for (int i = 0; i < 10000; ++i) items.push_back(Value::integer(i));
  std::string wide = Value::list(items)->repr();
  CHECK(wide == "[0, 1, 2, 3, 4, 5, 6, 7, ... (10000 items)]");
  ValuePtr deep = Value::list({});
  for (int i = 0; i < 100; ++i) deep = Value::list({deep});
  CHECK(deep->repr() == "[[[[...]]]]");
  ValuePtr longs = Value::list({});
  for (int i = 0; i < 100; ++i) longs->items.push_back(Value::str(std::string(1000, 'x')));
  CHECK(longs->repr(3, 100).size() < 4200);
}

TEST_CASE("two's complement conversions match CPython's encode_long", "[pickle]") {
  CHECK(decimal_to_twos_complement("0") == "");
  CHECK(decimal_to_twos_complement("255") == std::string("\xff\x00", 2));
  CHECK(decimal_to_twos_complement("-128") == "\x80");
  CHECK(decimal_to_twos_complement("-129") == std::string("\x7f\xff", 2));
  CHECK(decimal_to_twos_complement("-32768") == std::string("\x00\x80", 2));
  CHECK(int64_to_twos_complement(-1) == "\xff");
  CHECK(int64_to_twos_complement(INT64_MIN) == std::string("\x00\x00\x00\x00\x00\x00\x00\x80", 8));
  CHECK(twos_complement_to_int64(std::string("\x00\x00\x00\x00\x00\x00\x00\x80\xff", 9)) == INT64_MIN);
  CHECK_FALSE(twos_complement_to_int64(std::string("\x00\x00\x00\x00\x00\x00\x00\x80\x00", 9)).has_value());
  CHECK(twos_complement_to_decimal(decimal_to_twos_complement("-340282366920938463463374607431768211456")) ==
        "-340282366920938463463374607431768211456");
  CHECK_THROWS_AS(decimal_to_twos_complement(std::string(4301, '9')), Error);
  CHECK_THROWS_AS(decimal_to_twos_complement("-"), Error);
}

TEST_CASE("UTF-8 check allows surrogates but not overlong or truncated forms", "[pickle]") {
  CHECK(is_valid_utf8("h\xc3\xa9"));
  CHECK(is_valid_utf8("\xed\xa0\x80"));
  CHECK_FALSE(is_valid_utf8("\xc0\x80"));
  CHECK_FALSE(is_valid_utf8("\xe4\xb8"));
  CHECK_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));
  CHECK(utf8_to_latin1(latin1_to_utf8("\x01\xff")) == "\x01\xff");
  CHECK_THROWS_AS(utf8_to_latin1("\xe4\xb8\x96"), Error);
}

TEST_CASE("find_node looks in every part of every node, each node once", "[pickle]") {
  ValuePtr shared = Value::list({Value::str("x")});
  ValuePtr deep = shared;
  for (int i = 0; i < 60; ++i) deep = Value::list({deep, deep});  // 2^60 paths, 62 nodes
  ValuePtr target = Value::global("m", "n");
  ValuePtr call = Value::call(Value::global("a", "b"), Value::tuple({}), Value::dict({{Value::str("k"), target}}));
  ValuePtr root = Value::dict({{Value::str("deep"), deep}, {Value::str("call"), call}});
  std::size_t visits = 0;
  const Value* found = find_node(*root, [&](const Value& v) {
    ++visits;
    return v.is_global("m", "n");
  });
  CHECK(found == target.get());
  CHECK(visits < 100);
  CHECK(find_node(*root, [](const Value& v) { return v.is_global("z", "z"); }) == nullptr);
}
