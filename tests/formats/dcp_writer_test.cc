#include <catch2/catch.hpp>

#include "formats/dcp/dcp_metadata.h"
#include "formats/dcp/dcp_writer.h"
#include "io/byte_source.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"

using namespace ckpt;
using pickle::Value;

namespace {
dcp::DcpMetadata sample() {
  dcp::DcpMetadata md;
  dcp::ItemMeta w;
  w.fqn = "model.w";
  w.is_tensor = true;
  w.dtype = DType::kBFloat16;
  w.size = {7, 8};
  w.chunks = {{{0, 0}, {4, 8}}, {{4, 0}, {3, 8}}};
  dcp::ItemMeta step;
  step.fqn = "optim.state.w.step";
  step.is_tensor = true;
  step.chunks = {{{}, {}}};
  dcp::ItemMeta lr;
  lr.fqn = "optim.param_groups.0.lr";
  md.items = {w, step, lr};
  md.planner_data["model.w"] = {Value::str("model"), Value::str("w")};
  md.planner_data["optim.param_groups.0.lr"] = {Value::str("optim"), Value::str("param_groups"), Value::integer(0),
                                                Value::str("lr")};
  md.planner_order = {"model.w", "optim.param_groups.0.lr"};
  md.storage[{"model.w", {0, 0}}] = {"__0_0.distcp", 0, 100, {}};
  md.storage[{"model.w", {4, 0}}] = {"__1_0.distcp", 0, 90, {}};
  md.storage[{"optim.state.w.step", {}}] = {"__0_0.distcp", 100, 50, {}};
  md.storage[{"optim.param_groups.0.lr", {}}] = {"__0_0.distcp", 150, 20, {}};
  return md;
}
}  // namespace

TEST_CASE("encoded DCP metadata parses back to the same items, planner data and storage", "[formats][dcp]") {
  std::string bytes = dcp::encode_metadata(sample(), std::string("out/ckpt"), "id");
  auto src = make_memory_source(bytes, "metadata");
  auto root = pickle::unpickle(*src, pickle::checkpoint_policy());
  dcp::DcpMetadata md = dcp::parse_metadata(*root);
  REQUIRE(md.items.size() == 3);
  CHECK(md.items[0].fqn == "model.w");
  CHECK(md.items[0].dtype == DType::kBFloat16);
  CHECK(md.items[0].size == Shape{7, 8});
  REQUIRE(md.items[0].chunks.size() == 2);
  CHECK(md.items[0].chunks[1].offsets == Shape{4, 0});
  CHECK(md.items[0].chunks[1].sizes == Shape{3, 8});
  CHECK(md.items[1].is_tensor);
  CHECK(md.items[1].size.empty());
  CHECK_FALSE(md.items[2].is_tensor);
  CHECK(md.planner_order == std::vector<std::string>{"model.w", "optim.param_groups.0.lr"});
  CHECK(md.planner_data["optim.param_groups.0.lr"][2]->int_value == 0);
  CHECK(md.storage.size() == 4);
  CHECK(md.storage[{"model.w", {4, 0}}].relative_path == "__1_0.distcp");
  CHECK(md.storage[{"optim.param_groups.0.lr", {}}].offset == 150);
  CHECK(md.storage[{"optim.param_groups.0.lr", {}}].length == 20);
  CHECK(md.version == "1.0.0");
  CHECK(md.has_storage_meta);
}

TEST_CASE("encoded DCP metadata builds dataclasses with NEWOBJ like torch's pickle", "[formats][dcp]") {
  std::string bytes = dcp::encode_metadata(sample(), std::nullopt, "id");
  CHECK(bytes.substr(0, 2) == std::string("\x80\x02", 2));
  CHECK(bytes.find("ctorch.distributed.checkpoint.metadata\nMetadata\n") != std::string::npos);
  CHECK(bytes.find(std::string(")\x81", 2)) != std::string::npos);  // EMPTY_TUPLE NEWOBJ: cls.__new__(cls)
  CHECK(bytes.find("ctorch.distributed.checkpoint.filesystem\n_StorageInfo\n") != std::string::npos);
  CHECK(bytes.find("ctorch.serialization\n_get_layout\n") != std::string::npos);
  CHECK(bytes.find("torch.strided") != std::string::npos);
}

TEST_CASE("encoding refuses an item without a storage entry", "[formats][dcp]") {
  dcp::DcpMetadata md = sample();
  md.storage.erase({"model.w", {4, 0}});
  CHECK_THROWS(dcp::encode_metadata(md, std::nullopt, "id"));
}
