#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "allow_all_policy.h"
#include "core/error.h"
#include "cpython_samples.h"
#include "pickle/encodings.h"
#include "pickle/pickler.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"
#include "pickle/value.h"

using namespace ckpt;
using namespace ckpt::pickle;
using namespace cpython_samples;

namespace {

using testing::kAllowAll;

ValuePtr round_trip(const Value& v) { return unpickle(pickle_protocol2(v), kAllowAll); }

ValuePtr int_list(std::initializer_list<int64_t> values) {
  std::vector<ValuePtr> items;
  for (int64_t v : values) items.push_back(Value::integer(v));
  return Value::list(std::move(items));
}

// Deep structural equality (sharing not compared).
bool same(const ValuePtr& a, const ValuePtr& b);

bool same_items(const std::vector<ValuePtr>& a, const std::vector<ValuePtr>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!same(a[i], b[i])) return false;
  }
  return true;
}

bool same(const ValuePtr& a, const ValuePtr& b) {
  if (!a || !b) return !a && !b;
  if (a->kind != b->kind || a->bool_value != b->bool_value || a->int_value != b->int_value ||
      a->bytearray != b->bytearray || a->ordered != b->ordered || a->newobj != b->newobj || a->text != b->text ||
      a->name != b->name) {
    return false;
  }
  bool floats_equal = a->float_value == b->float_value || (std::isnan(a->float_value) && std::isnan(b->float_value));
  if (!floats_equal || !same_items(a->items, b->items) || a->entries.size() != b->entries.size()) return false;
  for (std::size_t i = 0; i < a->entries.size(); ++i) {
    if (!same(a->entries[i].first, b->entries[i].first) || !same(a->entries[i].second, b->entries[i].second)) {
      return false;
    }
  }
  return same(a->callable, b->callable) && same(a->args, b->args) && same(a->kwargs, b->kwargs) &&
         same(a->object, b->object) && same(a->state, b->state) && same(a->pid, b->pid);
}

std::size_t count_byte(const std::string& s, char c) { return std::count(s.begin(), s.end(), c); }

}  // namespace

// ---- byte-exact against CPython's pickle.dumps(protocol=2) ----

TEST_CASE("pickler matches CPython byte for byte on hand-built plain values", "[pickle]") {
  CHECK(pickle_protocol2(*Value::none()) == kExactNone);
  CHECK(pickle_protocol2(*Value::boolean(true)) == kExactTrue);
  ValuePtr ints = int_list({0, 255, 256, 65535, 65536, -1, INT32_MAX, INT32_MIN, 2147483648LL, INT64_MAX, INT64_MIN});
  ints->items.push_back(Value::big_integer(decimal_to_twos_complement("18446744073709551616")));
  ints->items.push_back(Value::integer(-129));
  ints->items.push_back(Value::integer(128));
  CHECK(pickle_protocol2(*ints) == kExactInts);
  ValuePtr floats = Value::list(
      {Value::floating(1.5), Value::floating(-0.0), Value::floating(std::numeric_limits<double>::infinity())});
  CHECK(pickle_protocol2(*floats) == kExactFloat);
  CHECK(pickle_protocol2(*Value::str("h\xc3\xa9llo \xe4\xb8\x96\xf0\x9f\x98\x80")) == kExactStr);
  ValuePtr bytes = Value::list({Value::bytes(std::string("\x00\xff", 2)), Value::bytes("ab")});
  CHECK(pickle_protocol2(*bytes) == kExactBytes);  // the second 'latin1' is a BINGET, as in CPython
  ValuePtr dict = Value::dict({{Value::str("a"), Value::integer(1)}, {Value::str("b"), Value::list({Value::none()})}});
  CHECK(pickle_protocol2(*dict) == kExactDict);
  ValuePtr ordered = Value::dict({{Value::str("a"), Value::integer(1)}, {Value::str("b"), Value::integer(2)}}, true);
  CHECK(pickle_protocol2(*ordered) == kExactOrderedDict);
  ValuePtr set = std::make_shared<Value>(Kind::kSet);
  set->items = int_list({1, 2, 3})->items;
  CHECK(pickle_protocol2(*set) == kExactSet);
  ValuePtr bytearray = Value::bytes("ab");
  bytearray->bytearray = true;
  CHECK(pickle_protocol2(*bytearray) == kExactByteArray);
}

TEST_CASE("unpickling CPython protocol-2 output and pickling it again gives the same bytes", "[pickle]") {
  for (const std::string* sample :
       {&kExactNone, &kExactTrue, &kExactInts, &kExactFloat, &kExactStr, &kExactBytes, &kExactDict, &kExactTuples,
        &kExactOrderedDict, &kExactSet, &kExactByteArray, &kSharedListProtocol2, &kBigIntsProtocol2}) {
    ValuePtr v = unpickle(*sample, checkpoint_policy());
    INFO(v->repr());
    CHECK(pickle_protocol2(*v) == *sample);
  }
}

TEST_CASE("a list that contains itself pickles as CPython does", "[pickle]") {
  ValuePtr l = Value::list({});
  l->items.push_back(l);
  std::string out = pickle_protocol2(*l);
  l->items.clear();  // break the cycle
  CHECK(out == kSelfContainingList);
}

// ---- round trips ----

TEST_CASE("pickle then unpickle gives the same tree for every kind", "[pickle]") {
  ValuePtr frozen = std::make_shared<Value>(Kind::kFrozenSet);
  frozen->items = {Value::str("f")};
  ValuePtr call = Value::call(Value::global("torch._utils", "_rebuild_tensor_v2"),
                              Value::tuple({Value::integer(0), Value::tuple({})}));
  call->items = {Value::integer(9)};
  call->entries = {{Value::str("k"), Value::none()}};
  ValuePtr newobj = Value::call(Value::global("torch.distributed.checkpoint.metadata", "Metadata"), Value::tuple({}));
  newobj->newobj = true;
  ValuePtr bytearray = Value::bytes(std::string("\x00\x80", 2));
  bytearray->bytearray = true;
  ValuePtr tree = Value::dict(
      {{Value::str("none"), Value::none()},
       {Value::str("big"), Value::big_integer(decimal_to_twos_complement("-123456789012345678901234567890"))},
       {Value::str("nan"), Value::floating(std::nan(""))},
       {Value::str("empty bytes"), Value::bytes("")},
       {Value::str("bytearray"), bytearray},
       {Value::str("frozen"), frozen},
       {Value::str("tuple5"),
        Value::tuple({Value::integer(1), Value::integer(2), Value::integer(3), Value::integer(4), Value::integer(5)})},
       {Value::integer(7), Value::boolean(false)},
       {Value::str("call"), call},
       {Value::str("built"), Value::built(newobj, Value::dict({{Value::str("version"), Value::str("1.0.0")}}))},
       {Value::str("persid"), Value::persistent_id(Value::tuple({Value::str("storage"), Value::str("0")}))}},
      true);
  ValuePtr back = round_trip(*tree);
  INFO(back->repr(6, 20));
  CHECK(same(tree, back));
}

TEST_CASE("a persistent id shared twice stays one object after a round trip", "[pickle]") {
  ValuePtr storage = Value::persistent_id(Value::tuple({Value::str("storage"), Value::global("torch", "FloatStorage"),
                                                        Value::str("0"), Value::str("cpu"), Value::integer(6)}));
  auto tensor = [&](int64_t offset) {
    return Value::call(Value::global("torch._utils", "_rebuild_tensor_v2"),
                       Value::tuple({storage, Value::integer(offset), Value::tuple({Value::integer(2)}),
                                     Value::tuple({Value::integer(1)}), Value::boolean(false), Value::dict({}, true)}));
  };
  ValuePtr sd = Value::dict({{Value::str("a"), tensor(0)}, {Value::str("b"), tensor(2)}}, true);
  std::string bytes = pickle_protocol2(*sd);
  CHECK(count_byte(bytes, 'Q') == 1);  // one BINPERSID
  ValuePtr back = unpickle(bytes, checkpoint_policy());
  ValuePtr a = back->at("a")->args->items[0];
  ValuePtr b = back->at("b")->args->items[0];
  CHECK(a->kind == Kind::kPersId);
  CHECK(a == b);
  // the global is written once and fetched from the memo afterwards
  CHECK(bytes.find("ctorch._utils\n_rebuild_tensor_v2\n") == bytes.rfind("ctorch._utils\n_rebuild_tensor_v2\n"));
}

TEST_CASE("torch.save data.pkl and DCP .metadata survive unpickle, pickle, unpickle", "[pickle]") {
  for (const std::string* sample : {&kTorchLinearDataPkl, &kDcpMetadata}) {
    ValuePtr v = unpickle(*sample, checkpoint_policy());
    std::string bytes = pickle_protocol2(*v);
    CHECK(bytes.substr(0, 2) == "\x80\x02");
    CHECK(same(v, unpickle(bytes, checkpoint_policy())));
  }
}

TEST_CASE("lists and dicts are written in batches of 1000", "[pickle]") {
  std::vector<ValuePtr> items;
  for (int i = 0; i < 2001; ++i) items.push_back(Value::none());
  ValuePtr list = Value::list(items);
  std::string bytes = pickle_protocol2(*list);
  CHECK(count_byte(bytes, 'e') == 2);  // two APPENDS of 1000
  CHECK(count_byte(bytes, 'a') == 1);  // then one APPEND
  CHECK(round_trip(*list)->items.size() == 2001);
  ValuePtr dict = Value::dict();
  for (int i = 0; i < 1500; ++i) dict->entries.emplace_back(Value::integer(i), Value::none());
  ValuePtr back = round_trip(*dict);
  REQUIRE(back->entries.size() == 1500);
  CHECK(back->entries[1499].first->as_int() == 1499);
}

TEST_CASE("memo indices past 255 use LONG_BINPUT and LONG_BINGET", "[pickle]") {
  std::vector<ValuePtr> strs;
  for (int i = 0; i < 300; ++i) strs.push_back(Value::str(std::to_string(i) + "s"));
  ValuePtr list = Value::list(strs);
  list->items.push_back(strs[299]);
  std::string bytes = pickle_protocol2(*list);
  CHECK(bytes.find(std::string("j\x2c\x01\x00\x00", 5)) != std::string::npos);  // LONG_BINGET 300
  ValuePtr back = round_trip(*list);
  CHECK(back->items[300] == back->items[299]);
}

TEST_CASE("calls with keyword arguments cannot be written at protocol 2", "[pickle]") {
  ValuePtr call = Value::call(Value::global("m", "f"), Value::tuple({}), Value::dict());
  try {
    pickle_protocol2(*call);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInternal);
    CHECK(e.message().find("keyword arguments") != std::string::npos);
  }
}
