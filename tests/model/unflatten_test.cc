#include <catch2/catch.hpp>

#include "core/error.h"
#include "model/unflatten.h"

using namespace ckpt;
using pickle::Value;

TEST_CASE("paths rebuild nested dicts and lists like set_element", "[model]") {
  Unflattener u;
  u.set({Value::str("model"), Value::str("w")}, Value::integer(1));
  u.set({Value::str("optim"), Value::str("param_groups"), Value::integer(1), Value::str("lr")}, Value::floating(0.5));
  u.set({Value::str("optim"), Value::str("param_groups"), Value::integer(0), Value::str("lr")}, Value::floating(0.1));
  u.set({Value::str("model"), Value::str("b")}, Value::integer(2));
  CHECK(u.root()->repr(5, 10) == "{'model': {'w': 1, 'b': 2}, 'optim': {'param_groups': [{'lr': 0.1}, {'lr': 0.5}]}}");
}

TEST_CASE("a path through a plain value is corrupt metadata", "[model]") {
  Unflattener u;
  u.set({Value::str("a")}, Value::integer(1));
  CHECK_THROWS_AS(u.set({Value::str("a"), Value::str("b")}, Value::integer(2)), Error);
  CHECK_THROWS_AS(u.set({}, Value::integer(2)), Error);
  CHECK_THROWS_AS(u.set({Value::str("l"), Value::integer(1ll << 40)}, Value::integer(2)), Error);
}
