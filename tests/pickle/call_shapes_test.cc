// The checkpoint policy refuses every way a pickle can reach a callable
// other than the exact call shapes torch writes (tools/hostile_pickles.py),
// and still accepts those shapes (the real samples of cpython_samples.h and
// every fixture, through the pytest suite).
#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "cpython_samples.h"
#include "hostile_samples.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"
#include "refusals.h"

using namespace ckpt;
using namespace ckpt::pickle;
using refusals::contains;
using refusals::refusal;
using namespace cpython_samples;

TEST_CASE("every hostile pickle is refused as Unsafe", "[pickle][hostile]") {
  REQUIRE(hostile_samples::kAll.size() >= 20);
  for (const auto& [name, bytes] : hostile_samples::kAll) {
    INFO(name);
    std::string message = refusal(bytes);
    CHECK_FALSE(message == "accepted");
    CHECK_FALSE(contains(message, "not Unsafe"));
  }
}

TEST_CASE("the getattr chain to eval is refused naming the call", "[pickle][hostile]") {
  std::string bytes;
  for (const auto& [name, b] : hostile_samples::kAll)
    if (name == "getattr_chain") bytes = b;
  std::string message = refusal(bytes);
  CHECK(contains(message, "builtins.getattr(builtins.getattr, '__self__')"));
  CHECK(contains(message, "not a call a checkpoint makes"));
}

TEST_CASE("getattr is accepted only as getattr(ShardedTensor, 'ProcessGroupState')", "[pickle]") {
  const std::string st = "ctorch.distributed._shard.sharded_tensor.api\nShardedTensor\n";
  const std::string getattr =
      "\x80\x02"
      "c__builtin__\ngetattr\n" +
      st;
  std::string ok = getattr + bytes_of("X\x11\x00\x00\x00ProcessGroupState\x86R.");
  CHECK(unpickle(ok, checkpoint_policy())->is(Kind::kCall));
  std::string other_attr = getattr + bytes_of("X\x08\x00\x00\x00__init__\x86R.");
  CHECK(contains(refusal(other_attr), "getattr("));
  // and its result may be instantiated (NEWOBJ) and built, as ShardedTensor state does
  std::string newobj = getattr + bytes_of(
                                     "X\x11\x00\x00\x00ProcessGroupState\x86R"
                                     "K\x01\x85\x81.");
  CHECK(unpickle(newobj, checkpoint_policy())->newobj);
}

TEST_CASE("getattr(EnumClass, 'NAME') is accepted for an allow-listed enum's members only", "[pickle]") {
  // Python 3.11 (Debian 12's 3.11.2 with its torch 1.13) pickles an Enum
  // member as getattr(cls, name): protocol 2, GLOBAL getattr, GLOBAL cls,
  // the name, TUPLE2, REDUCE.
  auto lookup = [](const std::string& cls, const std::string& name) {
    std::string s =
        "\x80\x02"
        "c__builtin__\ngetattr\n"
        "c" +
        cls + "\n";
    s += 'X';
    for (int i = 0; i < 4; ++i) s += static_cast<char>((name.size() >> (8 * i)) & 0xff);
    return s + name + "\x86R.";
  };
  const std::string st = "torch.distributed._shard.sharded_tensor.metadata\nMEM_FORMAT_ENCODING";
  const std::string dcp = "torch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING";
  const std::string zero = "deepspeed.runtime.zero.config\nZeroStageEnum";
  ValuePtr v = unpickle(lookup(st, "TORCH_CONTIGUOUS_FORMAT"), checkpoint_policy());
  CHECK(enum_value(*v) == std::optional<int64_t>(0));
  CHECK(enum_value(*unpickle(lookup(dcp, "TORCH_CHANNELS_LAST"), checkpoint_policy())) == std::optional<int64_t>(1));
  CHECK(enum_value(*unpickle(lookup(zero, "gradients"), checkpoint_policy())) == std::optional<int64_t>(2));
  CHECK(enum_value(*unpickle(lookup(zero, "max_stage"), checkpoint_policy())) == std::optional<int64_t>(3));
  // the older call form has the same value
  CHECK(enum_value(*unpickle(std::string("\x80\x02") + "c" + zero + "\nK\x02\x85R.", checkpoint_policy())) ==
        std::optional<int64_t>(2));
  // a name the class does not have, a dunder, another class's member, a class off the list
  CHECK(contains(refusal(lookup(st, "TORCH_NO_SUCH_FORMAT")), "getattr("));
  CHECK(contains(refusal(lookup(st, "__class__")), "getattr("));
  CHECK(contains(refusal(lookup(zero, "TORCH_CONTIGUOUS_FORMAT")), "getattr("));
  CHECK(contains(refusal(lookup("enum\nEnum", "TORCH_CONTIGUOUS_FORMAT")), "enum.Enum"));
  // an enum member is no class: NEWOBJ on it is refused
  std::string newobj = lookup(st, "TORCH_CONTIGUOUS_FORMAT");
  newobj.pop_back();
  CHECK(contains(refusal(newobj + ")\x81."), "__new__"));
}

TEST_CASE("values-only globals cannot be called", "[pickle]") {
  CHECK(contains(refusal("\x80\x02"
                         "ctorch\nfloat32\n)R."),
                 "torch.float32()"));
  CHECK(contains(refusal("\x80\x02"
                         "ctorch\nFloatStorage\nK\x03\x85R."),
                 "torch.FloatStorage(3)"));
  // a record class is built with NEWOBJ, never called (that would run __init__)
  CHECK(contains(refusal("\x80\x02"
                         "ctorch.distributed.checkpoint.metadata\nMetadata\n)R."),
                 "Metadata()"));
}

TEST_CASE("the call shapes torch writes are accepted", "[pickle]") {
  // torch.Size, torch.device, OrderedDict, bytes/set folds, complex
  CHECK(unpickle(std::string("\x80\x02"
                             "ctorch\nSize\nK\x02K\x03\x86\x85R."),
                 checkpoint_policy())
            ->is(Kind::kCall));
  CHECK(unpickle(bytes_of("\x80\x02"
                          "ctorch\ndevice\nX\x03\x00\x00\x00"
                          "cpu\x85R."),
                 checkpoint_policy())
            ->is(Kind::kCall));
  CHECK(unpickle(bytes_of("\x80\x02"
                          "c__builtin__\ncomplex\nG?\xf0\x00\x00\x00\x00\x00\x00G@\x00\x00\x00\x00\x00\x00\x00\x86R."),
                 checkpoint_policy())
            ->is(Kind::kCall));
  CHECK(unpickle(kCommonProtocol2, checkpoint_policy())->is(Kind::kDict));
  // an OrderedDict with attributes (state_dict()._metadata) is BUILD over the dict
  std::string od_attrs = bytes_of(
      "\x80\x02"
      "ccollections\nOrderedDict\n)R}X\x09\x00\x00\x00_metadata}sb.");
  CHECK(unpickle(od_attrs, checkpoint_policy())->is(Kind::kBuilt));
}

TEST_CASE("the quarantine policy records unknown globals and still refuses bad call shapes", "[pickle][hostile]") {
  const QuarantinePolicy quarantine(checkpoint_policy());
  auto known = [](std::string_view m, std::string_view n) { return checkpoint_policy().allows(m, n); };
  // {'args': types.SimpleNamespace() with state {'lr': 1}}: NEWOBJ then BUILD
  // (argparse.Namespace is read as data: framework_objects_test.cc)
  std::string ns = bytes_of(
      "\x80\x02}X\x04\x00\x00\x00"
      "args"
      "ctypes\nSimpleNamespace\n)\x81}X\x02\x00\x00\x00lrK\x01sbs.");
  ValuePtr root = unpickle(ns, quarantine);
  CHECK(first_quarantined_global(*root, known) == "types.SimpleNamespace");
  CHECK(first_quarantined_global(*root->at("args")->state, known).empty());
  CHECK(contains(refusal(ns), "types.SimpleNamespace"));
  // calling what a quarantined call made is refused like any call
  std::string twice = bytes_of(
      "\x80\x02"
      "cbuiltins\neval\nX\x01\x00\x00\x00"
      "1\x85R)R.");
  CHECK_THROWS_AS(unpickle(twice, quarantine), Error);
  // the getattr chain goes through allowed globals: still refused
  for (const auto& [name, b] : hostile_samples::kAll) {
    if (name != "getattr_chain") continue;
    CHECK_THROWS_AS(unpickle(b, quarantine), Error);
  }
}
