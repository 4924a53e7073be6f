#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "model/checkpoint_model.h"
#include "model/plain_values.h"

using namespace ckpt;
using pickle::Value;
using pickle::ValuePtr;

namespace {

std::string objection(const ValuePtr& root) {
  try {
    require_plain_values(*root);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnsafe);
    return e.message();
  }
  return "";
}

ValuePtr entry(const char* key, ValuePtr value) { return Value::dict({{Value::str(key), std::move(value)}}); }

}  // namespace

TEST_CASE("plain values, tensors, torch.Size and dtypes pass the output gate", "[model]") {
  ValuePtr size = Value::call(Value::global("torch", "Size"), Value::tuple({Value::tuple({Value::integer(2)})}));
  ValuePtr od = Value::dict({{Value::str("a"), Value::integer(1)}}, true);
  ValuePtr with_attrs = Value::built(od, entry("_metadata", Value::dict()));
  ValuePtr root =
      Value::dict({{Value::str("t"), make_tensor_ref(0)},
                   {Value::str("size"), size},
                   {Value::str("dt"), Value::global("torch", "float16")},
                   {Value::str("sd"), with_attrs},
                   {Value::str("l"), Value::list({Value::none(), Value::bytes("x"), Value::floating(0.5)})}});
  CHECK(objection(root).empty());
}

TEST_CASE("a record object left in the tree is refused naming its path", "[model]") {
  ValuePtr record = Value::call(Value::global("torch.distributed.checkpoint.metadata", "Metadata"), Value::tuple({}));
  record->newobj = true;
  ValuePtr root = entry("optim", entry("param_groups", Value::list({Value::built(record, Value::dict())})));
  std::string message = objection(root);
  CHECK(message.find("'optim.param_groups.0'") != std::string::npos);
  CHECK(message.find("BUILD") != std::string::npos);
  ValuePtr path = Value::call(Value::global("pathlib", "PosixPath"), Value::tuple({Value::str("/x")}));
  CHECK(objection(entry("p", path)).find("pathlib.PosixPath") != std::string::npos);
  CHECK(objection(entry("g", Value::global("builtins", "getattr"))).find("builtins.getattr") != std::string::npos);
}

TEST_CASE("the output gate visits a shared subtree once", "[model]") {
  // 64 levels of a = [a, a]: 2^64 paths, 65 nodes.
  ValuePtr a = Value::list({Value::str("lol")});
  for (int i = 0; i < 64; ++i) a = Value::list({a, a});
  CHECK(objection(entry("x", a)).empty());
}
