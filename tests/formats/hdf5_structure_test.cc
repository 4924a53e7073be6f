#ifdef CKPT_HAVE_HDF5
#include "formats/hdf5/hdf5_structure.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>

#include "core/error.h"

using namespace ckpt;
using pickle::Value;
using pickle::ValuePtr;

namespace {

class Sized final : public ByteSource {
 public:
  explicit Sized(uint64_t n) : n_(n) {}
  uint64_t size() const override { return n_; }
  void read(uint64_t, void*, std::size_t) const override {}
  std::string describe() const override { return "test"; }

 private:
  uint64_t n_;
};

CheckpointModel decode(const std::string& message) {
  return hdf5::model_from_structure(
      message, "m.h5", [](std::size_t, uint64_t n, const std::string&) { return std::make_shared<Sized>(n); });
}

std::string refusal(const std::string& message) {
  try {
    decode(message);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("hdf5 structure: a model travels whole, shared subtrees once") {
  CheckpointModel m;
  m.facts["source_format"] = "dcp";
  TensorEntry w;
  w.name = "model.w";
  w.dtype = DType::kBFloat16;
  w.shape = {3, 4};
  m.tensors.push_back(w);
  ValuePtr shared = Value::list(
      {Value::integer(1), Value::floating(std::nan("")), Value::floating(-std::numeric_limits<double>::infinity())});
  m.root = Value::dict({{Value::str("w"), make_tensor_ref(0)},
                        {Value::str("a"), shared},
                        {Value::str("b"), shared},
                        {Value::integer(7), Value::tuple({Value::none(), Value::boolean(true), Value::str("x")})}});
  std::string message = hdf5::structure_message(m);
  CheckpointModel back = decode(message);
  CHECK(back.facts.at("source_format") == "dcp");
  REQUIRE(back.tensors.size() == 1);
  CHECK(back.tensors[0].name == "model.w");
  CHECK(back.tensors[0].dtype == DType::kBFloat16);
  CHECK(back.tensors[0].shape == Shape{3, 4});
  CHECK(back.tensors[0].chunks.front().storage->size() == 24);
  CHECK(back.tensors[0].chunks.front().file == "m.h5");
  CHECK(hdf5::structure_message(back) == message);  // the same tree, the same sharing
  const auto& e = back.root->entries;
  REQUIRE(e.size() == 4);
  CHECK(tensor_ref_index(*e[0].second) == 0u);
  CHECK(e[1].second == e[2].second);  // one node, not two copies
  CHECK(std::isnan(e[1].second->items[1]->float_value));
  CHECK(e[3].first->int_value == 7);
  CHECK(e[3].second->kind == pickle::Kind::kTuple);
}

TEST_CASE("hdf5 structure: a message that is not one the child writes is refused, naming why") {
  CHECK_THAT(refusal("not json"), Catch::Contains("not a JSON object"));
  CHECK_THAT(refusal(R"({"facts":{},"tensors":[],"nodes":[["l",[0]]]})"), Catch::Contains("not before it"));
  CHECK_THAT(refusal(R"({"facts":{},"tensors":[],"nodes":[["T",0]]})"), Catch::Contains("did not describe"));
  CHECK_THAT(refusal(R"({"facts":{},"tensors":[{"name":"w","dtype":"float33","shape":[1]}],"nodes":[["n"]]})"),
             Catch::Contains("unknown dtype"));
  CHECK_THAT(refusal(R"({"facts":{},"tensors":[{"name":"w","dtype":"float32","shape":[-1]}],"nodes":[["n"]]})"),
             Catch::Contains("negative"));
  CHECK_THAT(refusal(R"({"facts":{},"tensors":[{"name":"w","dtype":"float64","shape":[4294967296,4294967296]}],)"
                     R"("nodes":[["n"]]})"),
             Catch::Contains("w"));
  CHECK_THAT(refusal(R"({"facts":{},"tensors":[],"nodes":[["n"],["d",[[0,0]]]]})"), Catch::Contains("key"));
  CHECK_THAT(refusal(R"({"facts":{},"tensors":[],"nodes":[]})"), Catch::Contains("without a root"));
  CHECK_THAT(refusal(R"({"facts":{},"tensors":[],"nodes":[["q",1]]})"), Catch::Contains("unknown tag"));
}

TEST_CASE("hdf5 structure: text that is not UTF-8 is a corrupt file, named") {
  CheckpointModel m;
  m.root = Value::dict({{Value::str(std::string("k\xf4", 2)), Value::none()}});
  try {
    hdf5::structure_message(m);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK_THAT(e.what(), Catch::Contains("not UTF-8") && Catch::Contains("k\\xf4"));
  }
}
#endif
