// The decode table of docs/pickle-globals.md ("Framework objects as data"):
// numpy arrays, dtypes and scalars, argparse.Namespace and Megatron's enums
// read as plain data in exactly the shapes numpy and CPython pickle them
// (framework_samples.h), each keeping what was stored for DCP outputs; and
// every near miss refused (Unsafe) naming its global.
#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "framework_samples.h"
#include "pickle/framework_objects.h"
#include "pickle/pickler.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"
#include "refusals.h"

using namespace ckpt;
using namespace ckpt::pickle;
using refusals::contains;
using refusals::refusal;
using namespace framework_samples;

namespace {

std::vector<int64_t> ints(const Value& list) {
  std::vector<int64_t> out;
  for (const ValuePtr& v : list.as_sequence()) out.push_back(v->as_int());
  return out;
}

}  // namespace

TEST_CASE("numpy arrays read as what tolist() returns", "[pickle][framework]") {
  ValuePtr a = unpickle(kUint32Array, checkpoint_policy());
  REQUIRE(a->is(Kind::kList));
  CHECK(ints(*a) == std::vector<int64_t>{1, 2, 4000000000});
  // what was stored: _reconstruct(ndarray, (0,), b'b') built with its state
  REQUIRE(a->stored);
  CHECK(a->stored->is(Kind::kBuilt));
  CHECK(a->stored->object->callable->is_global("numpy._core.multiarray", "_reconstruct"));

  ValuePtr f = unpickle(kFortranInt64, checkpoint_policy());
  REQUIRE(f->as_sequence().size() == 2);
  CHECK(ints(*f->items[0]) == std::vector<int64_t>{-2, -1, 0});
  CHECK(ints(*f->items[1]) == std::vector<int64_t>{1, 2, 3});

  CHECK(ints(*unpickle(kBigEndianInt32, checkpoint_policy())) == std::vector<int64_t>{1, -2});

  ValuePtr hb = unpickle(kHalfAndBool, checkpoint_policy());
  CHECK(hb->items[0]->items[0]->as_number() == 1.5);
  CHECK(hb->items[0]->items[1]->as_number() == -2.0);
  CHECK(hb->items[1]->items[0]->is(Kind::kBool));
  CHECK(hb->items[1]->items[0]->bool_value);
  CHECK(!hb->items[1]->items[1]->bool_value);

  ValuePtr ze = unpickle(kZeroDAndEmpty, checkpoint_policy());
  CHECK(ze->items[0]->is(Kind::kFloat));
  CHECK(ze->items[0]->float_value == 2.25);
  CHECK(ze->items[1]->is(Kind::kList));
  CHECK(ze->items[1]->items.empty());

  // numpy 1.x's module name
  CHECK(ints(*unpickle(kUint32ArrayNumpy1, checkpoint_policy())) == std::vector<int64_t>{1, 2});
}

TEST_CASE("numpy scalars, dtypes and get_state() read as plain data", "[pickle][framework]") {
  ValuePtr s = unpickle(kScalars, checkpoint_policy());
  REQUIRE(s->items.size() == 4);
  CHECK(s->items[0]->is(Kind::kFloat));
  CHECK(s->items[0]->float_value == 1.5);
  CHECK(s->items[1]->as_int() == -7);
  CHECK(s->items[2]->is(Kind::kBool));
  CHECK(s->items[2]->bool_value);
  CHECK(s->items[3]->is(Kind::kBigInt));  // 2**64 - 1
  CHECK(s->items[0]->stored);
  CHECK(unpickle(kScalarNumpy1, checkpoint_policy())->as_int() == 3);

  ValuePtr d = unpickle(kDtype, checkpoint_policy());
  CHECK(d->as_str() == "<f4");

  ValuePtr st = unpickle(kRandomState, checkpoint_policy());
  REQUIRE(st->as_sequence().size() == 5);
  CHECK(st->items[0]->as_str() == "MT19937");
  CHECK(st->items[1]->as_sequence().size() == 624);
  CHECK(st->items[2]->as_int() == 624);
}

TEST_CASE("an argparse.Namespace reads as its dict, Megatron's enums as their values", "[pickle][framework]") {
  ValuePtr ns = unpickle(kNamespace, checkpoint_policy());
  REQUIRE(ns->is(Kind::kDict));
  CHECK(ns->at("lr")->as_number() == 0.5);
  CHECK(ns->at("attention_backend")->is(Kind::kInt));
  CHECK(ns->at("attention_backend")->as_int() == 5);
  CHECK(ns->at("model_type")->as_int() == 1);
  CHECK(ns->at("attention_backend")->stored->is(Kind::kCall));
  ValuePtr empty = unpickle(kEmptyNamespace, checkpoint_policy());
  CHECK(empty->items[0]->is(Kind::kDict));
  CHECK(empty->items[0]->entries.empty());
}

TEST_CASE("what was stored is written back for DCP items", "[pickle][framework]") {
  // with_stored_objects puts every stored object back: the pickle it
  // makes names numpy and argparse again, and reads back to the same data.
  for (const std::string* sample : {&kRandomState, &kNamespace, &kScalars, &kFortranInt64}) {
    ValuePtr v = unpickle(*sample, checkpoint_policy());
    std::string again = pickle_protocol2(*with_stored_objects(v));
    bool names_framework = contains(again, "numpy") || contains(again, "argparse");
    CHECK(names_framework);
    ValuePtr back = unpickle(again, checkpoint_policy());
    CHECK(back->repr(6, 1000) == v->repr(6, 1000));
  }
}

TEST_CASE("near misses of the framework shapes are refused naming the global", "[pickle][framework][hostile]") {
  struct Case {
    const std::string* bytes;
    const char* names;
  };
  const Case cases[] = {
      {&kArrayStateTooShort, "numpy._core.multiarray._reconstruct"},
      {&kArrayStateWrongSize, "numpy._core.multiarray._reconstruct"},
      {&kReconstructOtherClass, "numpy._core.multiarray._reconstruct(collections.OrderedDict"},
      {&kDtypeUnknownCode, "numpy.dtype('c16'"},
      {&kDtypeWithFields, "numpy.dtype"},
      {&kObjectArray, "numpy.dtype('O8'"},
      {&kScalarWrongSize, "numpy._core.multiarray.scalar"},
      {&kEnumNotInTable, "megatron.core.transformer.enums.NotInTheTable"},
      {&kEnumValueNotInTable, "megatron.core.transformer.enums.AttnBackend(9)"},
      {&kNamespaceWithArgs, "argparse.Namespace.__new__(1)"},
      {&kNamespaceIntKey, "argparse.Namespace() to {1: 2}"},
  };
  // SETITEMS on a Namespace, APPENDS on an array: methods of the object in Python
  std::string setitems = bytes_of(
      "\x80\x02"
      "cargparse\nNamespace\n)\x81X\x01\x00\x00\x00"
      "aK\x01s.");
  CHECK(contains(refusal(setitems), "adds items to the argparse.Namespace object"));
  std::string appends = kUint32Array.substr(0, kUint32Array.size() - 1) +
                        "K\x01"
                        "a.";
  CHECK(contains(refusal(appends), "adds items to the numpy._core.multiarray._reconstruct object"));
  for (const Case& c : cases) {
    std::string said = refusal(*c.bytes);
    INFO(said);
    CHECK(contains(said, c.names));
    CHECK(!contains(said, "not Unsafe"));
  }
}

TEST_CASE("allow-global: a global's calls read as opaque records", "[pickle][framework]") {
  // ckpt_test_only.Opaque(1) with BUILD {'a': 2}; the name is this test's alone
  // (allow_opaque_global is process-wide).
  std::string opaque = bytes_of(
      "\x80\x02"
      "cckpt_test_only\nOpaque\nK\x01\x85R}X\x01\x00\x00\x00"
      "aK\x02sb.");
  std::string said = refusal(opaque);
  CHECK(contains(said, "global 'ckpt_test_only.Opaque'"));
  CHECK(contains(said, "--allow-global ckpt_test_only.Opaque"));
  allow_opaque_global("ckpt_test_only.Opaque");
  ValuePtr v = unpickle(opaque, checkpoint_policy());
  REQUIRE(v->is(Kind::kDict));
  CHECK(v->at("__global__")->as_str() == "ckpt_test_only.Opaque");
  CHECK(v->at("args")->items.at(0)->as_int() == 1);
  CHECK(v->at("state")->at("a")->as_int() == 2);
  // DCP outputs write the object again; it reads back to the same record
  std::string again = pickle_protocol2(*with_stored_objects(v));
  CHECK(contains(again, "ckpt_test_only"));
  CHECK(unpickle(again, checkpoint_policy())->repr(6, 100) == v->repr(6, 100));
  // SETITEMS on it would call its __setitem__
  std::string fill = opaque.substr(0, opaque.size() - 1) + "K\x03K\x04s.";
  CHECK(contains(refusal(fill), "adds items to the ckpt_test_only.Opaque object"));
}
