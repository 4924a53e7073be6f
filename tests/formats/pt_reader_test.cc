#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>

#include "core/error.h"
#include "formats/torch_pt/pt_reader.h"
#include "formats/torch_pt/sharded_values.h"

using namespace ckpt;

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
const std::string kSmallPt = std::string(CKPT_SOURCE_DIR) + "/tests/archive/data/torch_small.pt";
}  // namespace

TEST_CASE("a real torch.save file decodes to tensor descriptors", "[formats]") {
  std::vector<TensorEntry> tensors;
  auto root = torch_pt::decode_archive(make_memory_source(slurp(kSmallPt), "small.pt"), tensors);
  REQUIRE(!tensors.empty());
  CHECK(tensors[0].dtype == DType::kFloat32);
  CHECK(tensors[0].shape == Shape{3});
  float values[3];
  tensors[0].chunks[0].storage->read(0, values, sizeof values);
  CHECK(values[0] == 1.5f);
  CHECK(values[1] == -2.0f);
  CHECK(values[2] == 3.25f);
}

TEST_CASE("a torch.save file truncated at every byte is refused, never a crash", "[formats]") {
  std::string bytes = slurp(kSmallPt);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    std::vector<TensorEntry> tensors;
    CHECK_THROWS_AS(torch_pt::decode_archive(make_memory_source(bytes.substr(0, cut), "cut.pt"), tensors), Error);
  }
}

TEST_CASE("torch.chunk pieces match FSDP's row split", "[formats]") {
  using P = std::pair<int64_t, int64_t>;
  CHECK(torch_pt::chunk_piece(7, 4, 0) == P{0, 2});
  CHECK(torch_pt::chunk_piece(7, 4, 3) == P{6, 1});
  CHECK(torch_pt::chunk_piece(2, 3, 2) == P{2, 0});  // trailing ranks hold nothing
  CHECK(torch_pt::chunk_piece(10, 3, 2) == P{8, 2});
  CHECK_THROWS_AS(torch_pt::chunk_piece(10, 3, 3), Error);
}
