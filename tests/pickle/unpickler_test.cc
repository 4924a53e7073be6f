#include <catch2/catch.hpp>

#include <limits>
#include <string>

#include "allow_all_policy.h"
#include "core/error.h"
#include "cpython_samples.h"
#include "pickle/encodings.h"
#include "pickle/framework_objects.h"
#include "pickle/pickler.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"
#include "pickle/value.h"

using namespace ckpt;
using namespace ckpt::pickle;
using namespace cpython_samples;

namespace {

using testing::kAllowAll;

ValuePtr load(const std::string& bytes, const UnpickleLimits& limits = {}) {
  return unpickle(bytes, kAllowAll, limits);
}

// The ckpt::Error that unpickling `bytes` throws; fails the test if none.
Error error_of(const std::string& bytes, const GlobalPolicy& policy = kAllowAll, const UnpickleLimits& limits = {}) {
  try {
    unpickle(bytes, policy, limits);
  } catch (const Error& e) {
    return e;
  }
  FAIL("unpickle did not throw");
  return Error(ErrorCode::kInternal, "unreachable");
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Checks the decoded kCommonProtocol* value (see cpython_samples.h).
void check_common(const Value& v) {
  REQUIRE(v.kind == Kind::kDict);
  const auto& a = v.at("a")->as_sequence();
  REQUIRE(a.size() == 6);
  CHECK(a[0]->as_int() == 1);
  CHECK(a[1]->as_int() == -2);
  CHECK(a[2]->as_number() == 3.5);
  CHECK(a[3]->kind == Kind::kNone);
  CHECK(a[4]->as_bool() == true);
  CHECK(a[5]->as_bool() == false);
  ValuePtr b = v.at("b");
  REQUIRE(b->kind == Kind::kTuple);
  CHECK(b->items[0]->as_str() == "x");
  CHECK(b->items[1]->as_bytes() == std::string("\x00\xff", 2));
  CHECK(b->items[1]->bytearray == false);
  REQUIRE(v.at("c")->kind == Kind::kBigInt);
  CHECK(v.at("c")->repr() == "1180591620717411303424");
  CHECK(v.at("d")->as_int() == INT64_MIN);
  CHECK(v.at("u")->as_str() == "h\xc3\xa9llo\n\\");
  ValuePtr s = v.at("s");
  REQUIRE(s->kind == Kind::kSet);
  REQUIRE(s->items.size() == 1);
  CHECK(s->items[0]->as_int() == 7);
  ValuePtr ba = v.at("ba");
  CHECK(ba->as_bytes() == "z");
  CHECK(ba->bytearray == true);
}

}  // namespace

// ---- every protocol ----

TEST_CASE("CPython pickles of protocols 0 to 5 decode to the same values", "[pickle]") {
  const std::string* samples[] = {&kCommonProtocol0, &kCommonProtocol1, &kCommonProtocol2,
                                  &kCommonProtocol3, &kCommonProtocol4, &kCommonProtocol5};
  for (int proto = 0; proto < 6; ++proto) {
    INFO("protocol " << proto);
    check_common(*unpickle(*samples[proto], checkpoint_policy()));
  }
}

TEST_CASE("Python 2 protocol 0 text opcodes decode (STRING escapes, INT bools, LONG with L)", "[pickle]") {
  ValuePtr v = load(kPython2Protocol0);
  CHECK(v->at("s")->as_str() == "ab'c\n\x01");
  CHECK(v->at("u")->as_str() == "h\xc3\xa9\\");
  REQUIRE(v->at("l")->kind == Kind::kBigInt);
  CHECK(v->at("l")->repr() == "12345678901234567890");
  CHECK(v->at("t")->as_bool() == true);
  CHECK(v->at("f")->as_number() == 1.5);
  CHECK(v->at("i")->as_int() == -7);
  CHECK(v->at("n")->kind == Kind::kNone);
}

TEST_CASE("frozenset of protocol 4 is a kFrozenSet", "[pickle]") {
  ValuePtr v = load(kFrozenSetProtocol4);
  REQUIRE(v->kind == Kind::kFrozenSet);
  REQUIRE(v->items.size() == 1);
  CHECK(v->items[0]->as_int() == 1);
}

TEST_CASE("OrderedDict() then SETITEMS becomes an ordered dict", "[pickle]") {
  ValuePtr v = unpickle(kOrderedDictProtocol2, checkpoint_policy());
  REQUIRE(v->kind == Kind::kDict);
  CHECK(v->ordered);
  REQUIRE(v->entries.size() == 2);
  CHECK(v->entries[0].first->as_str() == "x");
  CHECK(v->entries[1].second->as_int() == 2);
  CHECK(v->repr() == "OrderedDict({'x': 1, 'y': 2})");
}

TEST_CASE("memo references share one value", "[pickle]") {
  ValuePtr v = load(kSharedListProtocol2);
  REQUIRE(v->items.size() == 2);
  CHECK(v->items[0] == v->items[1]);
  CHECK(v->items[0]->items[0]->as_int() == 1);
}

TEST_CASE("BUILD changes the shared object in place, so memo references see the state", "[pickle]") {
  ValuePtr v = load(kSharedObjectProtocol2);
  REQUIRE(v->items.size() == 2);
  REQUIRE(v->items[0] == v->items[1]);
  const Value& p = *v->items[0];
  REQUIRE(p.kind == Kind::kBuilt);
  REQUIRE(p.object->kind == Kind::kCall);
  CHECK(p.object->newobj);
  CHECK(p.object->callable->is_global("__main__", "Point"));
  CHECK(p.state->at("x")->as_int() == 1);
}

TEST_CASE("integers beyond 64 bits keep their bytes and print in decimal", "[pickle]") {
  ValuePtr v = load(kBigIntsProtocol2);
  REQUIRE(v->items.size() == 5);
  for (const auto& item : v->items) CHECK(item->kind == Kind::kBigInt);
  CHECK(v->items[0]->text == std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x01", 9));
  CHECK(v->items[0]->repr() == "18446744073709551616");
  CHECK(v->items[1]->repr() == "-18446744073709551616");
  CHECK(v->items[2]->text.size() == 126);  // 2**1000 in LONG1
  CHECK(v->items[3]->text.size() == 263);  // 2**2100 needs LONG4
  CHECK_THROWS_AS(v->items[0]->as_int(), Error);
  ValuePtr text = load(kBigIntsProtocol0);
  CHECK(text->items[0]->repr() == "1180591620717411303424");
  CHECK(text->items[1]->repr() == "-1180591620717411303424");
  CHECK(text->items[2]->as_int() == 5);
}

TEST_CASE("LONG1 that fits in 64 bits is a plain int", "[pickle]") {
  // LONG1 with 9 bytes of -1 (sign extension), then STOP
  ValuePtr v = load(std::string("\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff.", 14));
  CHECK(v->as_int() == -1);
}

// ---- real checkpoints ----

TEST_CASE("torch.save data.pkl decodes to rebuild calls over persistent ids", "[pickle]") {
  ValuePtr root = unpickle(kTorchLinearDataPkl, checkpoint_policy());
  // state_dict() is an OrderedDict with a _metadata attribute: BUILD over it.
  REQUIRE(root->kind == Kind::kBuilt);
  CHECK(root->state->at("_metadata")->ordered);
  ValuePtr v = root->object;
  REQUIRE(v->kind == Kind::kDict);
  CHECK(v->ordered);
  ValuePtr w = v->at("weight");
  REQUIRE(w->kind == Kind::kCall);
  CHECK(w->callable->is_global("torch._utils", "_rebuild_tensor_v2"));
  const auto& args = w->args->as_sequence();
  REQUIRE(args.size() == 6);
  REQUIRE(args[0]->kind == Kind::kPersId);
  const auto& pid = args[0]->pid->as_sequence();
  CHECK(pid[0]->as_str() == "storage");
  CHECK(pid[1]->is_global("torch", "FloatStorage"));
  CHECK(pid[2]->as_str() == "0");
  CHECK(pid[3]->as_str() == "cpu");
  CHECK(pid[4]->as_int() == 6);
  CHECK(args[2]->as_sequence()[0]->as_int() == 3);
  CHECK(args[3]->as_sequence()[0]->as_int() == 2);
  CHECK(args[4]->as_bool() == false);
  CHECK(args[5]->ordered);
  CHECK(v->at("bias")->args->as_sequence()[0]->pid->as_sequence()[2]->as_str() == "1");
}

TEST_CASE("DCP .metadata (protocol 4: FRAME, MEMOIZE, STACK_GLOBAL) decodes", "[pickle]") {
  ValuePtr v = unpickle(kDcpMetadata, checkpoint_policy());
  REQUIRE(v->kind == Kind::kBuilt);
  CHECK(v->object->callable->is_global("torch.distributed.checkpoint.metadata", "Metadata"));
  ValuePtr sd = v->state->at("state_dict_metadata");
  ValuePtr w = sd->at("w");
  REQUIRE(w->kind == Kind::kBuilt);
  CHECK(w->object->callable->is_global("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"));
  ValuePtr size = w->state->at("size");
  CHECK(size->callable->is_global("torch", "Size"));
  ValuePtr f = sd->at("f");  // a dataclass without fields: NEWOBJ and no BUILD
  REQUIRE(f->kind == Kind::kCall);
  CHECK(f->callable->is_global("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"));
  CHECK(v->state->at("storage_data")->entries.size() == 3);
}

TEST_CASE("a realistic pickle truncated at any byte throws ckpt::Error", "[pickle]") {
  for (const std::string* sample : {&kTorchLinearDataPkl, &kDcpMetadata, &kCommonProtocol0}) {
    for (std::size_t n = 0; n < sample->size(); ++n) {
      INFO("prefix of " << n << " bytes");
      CHECK_THROWS_AS(unpickle(sample->substr(0, n), checkpoint_policy()), Error);
    }
  }
}

TEST_CASE("bytes after STOP are ignored", "[pickle]") {
  CHECK(load(std::string("\x80\x02K\x05.garbage", 12))->as_int() == 5);
}

// ---- refused globals ----

TEST_CASE("refuses os.system called through REDUCE (protocol 0 GLOBAL)", "[pickle]") {
  Error e = error_of("cos\nsystem\n(S'echo hi'\ntR.", checkpoint_policy());
  CHECK(e.code() == ErrorCode::kUnsafe);
  CHECK(contains(e.message(), "'os.system'"));
  CHECK(contains(e.message(), "GLOBAL at byte 0"));
}

TEST_CASE("refuses builtins.eval named through STACK_GLOBAL", "[pickle]") {
  Error e = error_of(kStackGlobalEval, checkpoint_policy());
  CHECK(e.code() == ErrorCode::kUnsafe);
  CHECK(contains(e.message(), "'builtins.eval'"));
  CHECK(contains(e.message(), "STACK_GLOBAL"));
}

TEST_CASE("refuses subprocess.Popen", "[pickle]") {
  Error e = error_of(bytes_of("\x80\x02"
                              "csubprocess\nPopen\n]X\x02\x00\x00\x00ls\x85R."),
                     checkpoint_policy());
  CHECK(e.code() == ErrorCode::kUnsafe);
  CHECK(contains(e.message(), "'subprocess.Popen'"));
  // CPython itself writes Python 2's module name at protocol 2 (commands.Popen).
  Error cpython = error_of(kPopen, checkpoint_policy());
  CHECK(cpython.code() == ErrorCode::kUnsafe);
  CHECK(contains(cpython.message(), "'commands.Popen'"));
}

TEST_CASE("refuses an object whose __reduce__ returns (os.system, ('echo',))", "[pickle]") {
  Error e = error_of(kReduceTrickSystem, checkpoint_policy());
  CHECK(e.code() == ErrorCode::kUnsafe);
  CHECK(contains(e.message(), "'posix.system'"));  // os.system's real module on Linux
}

TEST_CASE("refuses INST with a forbidden class", "[pickle]") {
  Error e = error_of("(S'echo'\nios\nsystem\n.", checkpoint_policy());
  CHECK(e.code() == ErrorCode::kUnsafe);
  CHECK(contains(e.message(), "'os.system'"));
  CHECK(contains(e.message(), "INST"));
}

TEST_CASE("refuses OBJ with a forbidden class", "[pickle]") {
  Error e = error_of("(cos\nsystem\nS'echo'\no.", checkpoint_policy());
  CHECK(e.code() == ErrorCode::kUnsafe);
  CHECK(contains(e.message(), "'os.system'"));
}

TEST_CASE("the allow-list matches exact module and name pairs only", "[pickle]") {
  const GlobalPolicy& p = checkpoint_policy();
  CHECK(p.allows("torch._utils", "_rebuild_tensor_v2"));
  CHECK(p.allows("collections", "OrderedDict"));
  CHECK(p.allows("torch.distributed.checkpoint.metadata", "Metadata"));
  CHECK_FALSE(p.allows("torch.distributed", "checkpoint.metadata.Metadata"));
  CHECK_FALSE(p.allows("torch", "load"));
  CHECK_FALSE(p.allows("builtins", "eval"));
  CHECK_FALSE(p.allows("__builtin__", "getattr"));  // the unpickler maps it to builtins first
  // protocol 2 ShardedTensor pickles name __builtin__.getattr
  CHECK(unpickle(std::string("\x80\x02"
                             "c__builtin__\ngetattr\n."),
                 p)
            ->is_global("builtins", "getattr"));
}

// ---- limits and corrupt input ----

TEST_CASE("100k nested lists are refused, not a stack overflow", "[pickle]") {
  std::string s = "\x80\x02";
  s.append(100000, ']');
  s.append(99999, 'a');
  s += '.';
  Error e = error_of(s);
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(contains(e.message(), "deeper than 512"));
}

TEST_CASE("a deep chain linked top-down through the memo is refused", "[pickle]") {
  // 200k empty lists memoized, then list i appended into list i-1 via GETs.
  const uint32_t n = 200000;
  std::string s = "\x80\x02";
  auto index = [](uint32_t i) { return std::string(reinterpret_cast<const char*>(&i), 4); };
  for (uint32_t i = 0; i < n; ++i) s.append("]r").append(index(i)).append("0");
  for (uint32_t i = 1; i < n; ++i) s.append("j").append(index(i - 1)).append("j").append(index(i)).append("a0");
  s.append("j").append(index(0)).append(".");
  Error e = error_of(s);
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(contains(e.message(), "deeper than"));
}

TEST_CASE("a deep chain left unreferenced in the memo is freed without recursion", "[pickle]") {
  const uint32_t n = 200000;
  std::string s = "\x80\x02";
  auto index = [](uint32_t i) { return std::string(reinterpret_cast<const char*>(&i), 4); };
  for (uint32_t i = 0; i < n; ++i) s.append("]r").append(index(i)).append("0");
  for (uint32_t i = 1; i < n; ++i) s.append("j").append(index(i - 1)).append("j").append(index(i)).append("a0");
  s += "N.";
  CHECK(load(s)->kind == Kind::kNone);
}

TEST_CASE("a self-containing list is refused as a cycle", "[pickle]") {
  Error e = error_of(kSelfContainingList);
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(contains(e.message(), "cycle"));
}

TEST_CASE("nested marks beyond the depth limit are refused", "[pickle]") {
  Error e = error_of(std::string(1000, '(') + "t.");
  CHECK(contains(e.message(), "nested marks"));
}

TEST_CASE("memo bomb: DUP and MEMOIZE in a loop stops at the memo limit", "[pickle]") {
  UnpickleLimits limits;
  limits.max_memo = 1000;
  std::string s = "\x80\x04N";
  for (int i = 0; i < 2000; ++i) s += "2\x94";
  s += ".";
  Error e = error_of(s, kAllowAll, limits);
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(contains(e.message(), "memo limit of 1000"));
  CHECK(contains(e.message(), "MEMOIZE at byte 2004"));
}

TEST_CASE("memo index far beyond the memo is refused, not allocated", "[pickle]") {
  Error put = error_of(std::string("\x80\x02Nr\xff\xff\xff\xff.", 9));
  CHECK(put.code() == ErrorCode::kDataLoss);
  CHECK(contains(put.message(), "memo index 4294967295"));
  Error get = error_of(std::string("\x80\x02j\xfe\xff\xff\xff.", 8));
  CHECK(contains(get.message(), "never stored"));
  CHECK(contains(error_of("g99999999999999999999999\n.").message(), "not a decimal"));
}

TEST_CASE("length prefixes beyond the data are DataLoss before any allocation", "[pickle]") {
  const std::string huge("\x00\x00\x00\x00\x00\x00\x00\x40", 8);  // 2^62
  for (char op : {'\x8d', '\x8e', '\x96'}) {                      // BINUNICODE8, BINBYTES8, BYTEARRAY8
    Error e = error_of(std::string("\x80\x05", 2) + op + huge + "abc.");
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK(contains(e.message(), "length prefix 4611686018427387904 exceeds"));
  }
  CHECK(contains(error_of(std::string("X\xff\xff\xff\xff", 5)).message(), "BINUNICODE at byte 0"));
  CHECK(contains(error_of(std::string("\x80\x02\x8b\xff\xff\xff\xff.", 8)).message(), "negative length"));
  CHECK(contains(error_of(std::string("T\xfe\xff\xff\xff.", 6)).message(), "negative length"));
  CHECK(contains(error_of(std::string("\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.", 13)).message(), "FRAME"));
}

TEST_CASE("container element limit", "[pickle]") {
  UnpickleLimits limits;
  limits.max_container = 3;
  CHECK(load("(I1\nI2\nI3\nl.", limits)->items.size() == 3);
  CHECK(contains(error_of("(I1\nI2\nI3\nI4\nl.", kAllowAll, limits).message(), "more than 3 elements"));
  CHECK(contains(error_of("(lI1\naI2\naI3\naI4\na.", kAllowAll, limits).message(), "more than 3 elements"));
}

TEST_CASE("total value limit", "[pickle]") {
  UnpickleLimits limits;
  limits.max_total_values = 10;
  CHECK(contains(error_of(std::string("(") + std::string(20, 'N') + "l.", kAllowAll, limits).message(),
                 "more than 10 values"));
}

TEST_CASE("structural errors name the opcode and its byte offset", "[pickle]") {
  CHECK(contains(error_of("a.").message(), "APPEND at byte 0: stack underflow"));
  CHECK(contains(error_of("N(a.").message(), "stack underflow"));  // the list is below the mark
  CHECK(contains(error_of("Nt.").message(), "TUPLE at byte 1: no mark"));
  CHECK(contains(error_of("N").message(), "without a STOP"));
  CHECK(contains(error_of(".").message(), "STOP at byte 0: stack underflow"));
  CHECK(contains(error_of("NNz.").message(), "unknown opcode 0x7a"));
  CHECK(contains(error_of("Nd.").message(), "no mark"));
  CHECK(contains(error_of("(Nd.").message(), "odd number"));
  CHECK(contains(error_of("I1\nN(s.").message(), "stack underflow"));
  CHECK(contains(error_of("I1\nNNs.").message(), "cannot set items of a int"));
  CHECK(contains(error_of("\x80\x02NK\x01\x93.").message(), "STACK_GLOBAL needs two str"));
  CHECK(contains(error_of("I12").message(), "no terminating newline"));
  CHECK(error_of(std::string("\x80\x07N.", 4)).code() == ErrorCode::kUnimplemented);
}

TEST_CASE("extension registry and out-of-band buffers are Unimplemented, naming the opcode", "[pickle]") {
  Error ext = error_of(std::string("\x80\x02\x82\x01.", 5));
  CHECK(ext.code() == ErrorCode::kUnimplemented);
  CHECK(contains(ext.message(), "EXT1"));
  CHECK(contains(error_of(std::string("\x80\x02\x83\x01\x00.", 6)).message(), "EXT2"));
  CHECK(contains(error_of(std::string("\x80\x02\x84\x01\x00\x00\x00.", 8)).message(), "EXT4"));
  Error buf = error_of(std::string("\x80\x05\x97.", 4));
  CHECK(buf.code() == ErrorCode::kUnimplemented);
  CHECK(contains(buf.message(), "NEXT_BUFFER"));
  CHECK(contains(error_of(std::string("\x80\x05N\x98.", 5)).message(), "READONLY_BUFFER"));
}

TEST_CASE("invalid UTF-8 in BINUNICODE is DataLoss; Python 2 str that is not UTF-8 stays bytes", "[pickle]") {
  CHECK(contains(error_of(std::string("X\x01\x00\x00\x00\xff.", 7)).message(), "UTF-8"));
  ValuePtr s = load(std::string("U\x01\xff.", 4));
  CHECK(s->as_bytes() == "\xff");
  // surrogates pass, as CPython's surrogatepass does
  CHECK(load(std::string("X\x03\x00\x00\x00\xed\xa0\x80.", 9))->as_str() == "\xed\xa0\x80");
}

TEST_CASE("protocol 0 text opcodes: escapes, floats, bools, persistent ids, memo", "[pickle]") {
  CHECK(load("S'\\x41\\101\\n\\q'\n.")->as_str() == "AA\n\\q");
  CHECK(load("S\"it's\"\n.")->as_str() == "it's");
  CHECK_THROWS_AS(load("S'abc\n."), Error);
  CHECK_THROWS_AS(load("S'\\x4'\n."), Error);
  CHECK(load("V\\u00e9\\U0001F600\\\\u\n.")->as_str() == "\xc3\xa9\xf0\x9f\x98\x80\\\\u");
  CHECK_THROWS_AS(load("V\\u12\n."), Error);
  CHECK(load("F-inf\n.")->float_value == -std::numeric_limits<double>::infinity());
  CHECK(load("F1e+300\n.")->as_number() == 1e300);
  CHECK_THROWS_AS(load("F1.5x\n."), Error);
  CHECK(load("I00\n.")->kind == Kind::kBool);
  CHECK(load("L-5L\n.")->as_int() == -5);
  CHECK_THROWS_AS(load("I12a\n."), Error);
  ValuePtr p = load("Pabc\n.");
  REQUIRE(p->kind == Kind::kPersId);
  CHECK(p->pid->as_str() == "abc");
  ValuePtr m = load("(I3\np0\ng0\nl.");
  CHECK(m->items[0] == m->items[1]);
}

// pickle.dumps(b, protocol=2) for b = io.BytesIO(b'ab\0') read to its end
// (CPython 3.11): NEWOBJ(_io.BytesIO, ()) then BUILD (bytes, position, None),
// as torch.save writes a BytesIO that DCP stores (torchtitan's train_state).
const std::string kBytesIoProtocol2(
    "\x80\x02"
    "c_io\nBytesIO\nq\x00)\x81q\x01"
    "c_codecs\nencode\nq\x02X\x03\x00\x00\x00"
    "ab\x00q\x03"
    "X\x06\x00\x00\x00latin1q\x04\x86q\x05Rq\x06K\x03N\x87q\x07"
    "b.",
    76);

TEST_CASE("an io.BytesIO is read as its bytes, flagged, with its position", "[pickle]") {
  ValuePtr v = unpickle(kBytesIoProtocol2, checkpoint_policy());
  REQUIRE(v->kind == Kind::kBytes);
  CHECK(v->text == std::string("ab\0", 3));
  CHECK(v->bytes_io);
  CHECK(v->int_value == 3);
  CHECK(v->repr() == "BytesIO(b'ab\\x00')");
}

TEST_CASE("a BytesIO turned back into an object pickles as a BytesIO again", "[pickle]") {
  ValuePtr v = unpickle(kBytesIoProtocol2, checkpoint_policy());
  // CPython's opcodes, except that the built object is memoized once more.
  std::string again = pickle_protocol2(*bytes_io_object(*v));
  CHECK(again.substr(0, 72) == kBytesIoProtocol2.substr(0, 72));
  ValuePtr back = unpickle(again, checkpoint_policy());
  CHECK((back->bytes_io && back->text == v->text && back->int_value == 3));
  ValuePtr list = Value::list({v, Value::integer(1)});
  ValuePtr restored = with_stored_objects(list);
  CHECK(restored != list);
  CHECK(restored->items[0]->is(Kind::kBuilt));
  CHECK(with_stored_objects(Value::list({Value::bytes("x")}))->items[0]->is(Kind::kBytes));
}

TEST_CASE("BytesIO objects come back in one visit per node of a shared graph", "[pickle]") {
  // 60 levels of [a, a] over one BytesIO: 2^60 paths, 61 nodes. A walk per
  // path never ends; the rebuilt graph shares its nodes as the input did.
  ValuePtr a = unpickle(kBytesIoProtocol2, checkpoint_policy());
  for (int i = 0; i < 60; ++i) a = Value::list({a, a});
  ValuePtr out = with_stored_objects(a);
  CHECK(out != a);
  CHECK(out->items[0] == out->items[1]);
  const Value* leaf = out.get();
  while (leaf->is(Kind::kList)) leaf = leaf->items[0].get();
  CHECK(leaf->is(Kind::kBuilt));
  ValuePtr plain = Value::list({Value::integer(1)});
  for (int i = 0; i < 60; ++i) plain = Value::list({plain, plain});
  CHECK(with_stored_objects(plain) == plain);  // nothing to change: the same node
}

TEST_CASE("a BytesIO with attributes or constructor arguments is refused", "[pickle][hostile]") {
  // io.BytesIO(b'x') with b.foo = 1: its state's dict is not empty.
  const std::string with_attribute(
      "\x80\x02"
      "c_io\nBytesIO\nq\x00)\x81q\x01"
      "c_codecs\nencode\nq\x02X\x01\x00\x00\x00xq\x03"
      "X\x06\x00\x00\x00latin1q\x04\x86q\x05Rq\x06K\x00}q\x07X\x03\x00\x00\x00"
      "fooq\x08K\x01s\x87q\tb.",
      89);
  Error e = error_of(with_attribute, checkpoint_policy());
  CHECK(e.code() == ErrorCode::kUnsafe);
  CHECK(contains(e.what(), "io.BytesIO"));
  // BUILD with a plain dict (setting attributes), and NEWOBJ with arguments.
  CHECK(error_of("\x80\x02"
                 "c_io\nBytesIO\n)\x81}U\x01"
                 "aK\x01sb.",
                 checkpoint_policy())
            .code() == ErrorCode::kUnsafe);
  CHECK(error_of("\x80\x03"
                 "c_io\nBytesIO\nK\x01\x85\x81(C\x01xK\x02Ntb.",
                 checkpoint_policy())
            .code() == ErrorCode::kUnsafe);
}

TEST_CASE("dicts are built as Python builds them: equal keys merge, unhashable keys are refused", "[pickle]") {
  using namespace std::string_literals;
  // {1: 'a', 1.0: 'b', True: 'c', 'k': 2, 'k': 3}: Python gives {1: 'c', 'k': 3}.
  ValuePtr d = load(
      "\x80\x02}(K\x01X\x01\x00\x00\x00"
      "aG?\xf0\x00\x00\x00\x00\x00\x00X\x01\x00\x00\x00"
      "b\x88X\x01\x00\x00\x00"
      "cX\x01\x00\x00\x00"
      "kK\x02X\x01\x00\x00\x00"
      "kK\x03u."s);
  REQUIRE(d->entries.size() == 2);
  CHECK(d->entries[0].first->is(Kind::kInt));  // the first key object stays
  CHECK(d->entries[0].second->as_str() == "c");
  CHECK(d->entries[1].second->as_int() == 3);

  // 40 keys (past the size where an index is kept), then key 5 again.
  std::string big = "\x80\x02}("s;
  for (int i = 0; i < 40; ++i) big += "K"s + static_cast<char>(i) + "K"s + static_cast<char>(i);
  big += "K\x05K\x63u."s;
  ValuePtr b = load(big);
  REQUIRE(b->entries.size() == 40);
  CHECK(b->entries[5].second->as_int() == 99);
  CHECK(b->entries[6].first->as_int() == 6);

  // A list as a key: TypeError in Python, DataLoss here.
  Error e = error_of("\x80\x02}(]K\x01u."s);
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(contains(e.what(), "unhashable type (list)"));
  // An OrderedDict (a dict subclass) as a key.
  Error o = error_of("\x80\x02}(ccollections\nOrderedDict\n)RK\x01u."s);
  CHECK(contains(o.what(), "unhashable type"));
  // A tuple key holding a list is unhashable too; one of ints is a key.
  CHECK(contains(error_of("\x80\x02}(K\x01]\x86K\x01u."s).what(), "unhashable type (tuple)"));
  CHECK(load("\x80\x02}(K\x01K\x02\x86K\x01u."s)->entries.size() == 1);
}
