#include <catch2/catch.hpp>

#include <numeric>

#include "exec/tensor_copy.h"
#include "model/tree_walk.h"
#include "plan/arch_map.h"
#include "plan/arch_map_inverse.h"

using namespace ckpt;

namespace {

// A float32 column of `rows` elements numbered 0..rows-1 (+ `base`), in
// chunks cut at `cuts` (TP pieces).
TensorEntry column(const std::string& name, int64_t rows, const std::vector<int64_t>& cuts, float base = 0) {
  TensorEntry t;
  t.name = name;
  t.shape = {rows, 1};
  std::vector<int64_t> starts = {0};
  starts.insert(starts.end(), cuts.begin(), cuts.end());
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const int64_t r0 = starts[i], r1 = i + 1 < starts.size() ? starts[i + 1] : rows;
    std::vector<float> v(static_cast<std::size_t>(r1 - r0));
    std::iota(v.begin(), v.end(), base + static_cast<float>(r0));
    TensorChunk c;
    c.offsets = {r0, 0};
    c.sizes = {r1 - r0, 1};
    c.strides = {1, 1};
    c.storage = make_memory_source(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
    t.chunks.push_back(c);
  }
  return t;
}

std::vector<float> values(const TensorEntry& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  assemble_rows(t, 0, t.shape[0], reinterpret_cast<std::byte*>(v.data()));
  return v;
}

}  // namespace

TEST_CASE("permute_rope's inverse undoes it, across TP pieces") {
  const TensorEntry interleaved = column("wq", 16, {6});  // 2 heads of 8 rows, cut inside the first head
  TensorEntry half = gather_rows(interleaved, interleaved_to_half_runs(16, 8), "q_proj");
  CHECK(values(half) == std::vector<float>{0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15});
  TensorEntry back = gather_rows(half, half_to_interleaved_runs(16, 8), "wq");
  CHECK(values(back) == values(interleaved));
  CHECK(back.shape == interleaved.shape);
}

TEST_CASE("concat of split sections gives the fused rows back, group by group") {
  // A megatron linear_qkv of 2 query groups, each 2 query rows, 1 key, 1 value.
  const TensorEntry fused = column("qkv", 8, {4});
  std::vector<TensorEntry> parts;
  for (std::size_t i = 0; i < 3; ++i) parts.push_back(gather_rows(fused, split_runs(2, {2, 1, 1}, i), "part"));
  CHECK(values(parts[0]) == std::vector<float>{0, 1, 4, 5});
  std::vector<RowPart> back;
  for (int64_t g = 0; g < 2; ++g) {
    back.push_back({&parts[0], {g * 2, 2, 1}});
    back.push_back({&parts[1], {g, 1, 1}});
    back.push_back({&parts[2], {g, 1, 1}});
  }
  CHECK(values(concat_rows(back, "qkv")) == values(fused));
}

TEST_CASE("concat refuses parts of different dtypes") {
  TensorEntry a = column("a", 2, {}), b = column("b", 2, {});
  b.dtype = DType::kBFloat16;
  CHECK_THROWS(concat_rows({{&a, {0, 2, 1}}, {&b, {0, 2, 1}}}, "ab"));
}

TEST_CASE("pad_rows appends zero rows") {
  const TensorEntry vocab = column("embed", 5, {3}, 1);
  TensorEntry padded = pad_rows(vocab, 8, "embedding");
  CHECK(padded.shape == Shape{8, 1});
  CHECK(values(padded) == std::vector<float>{1, 2, 3, 4, 5, 0, 0, 0});
  CHECK(values(pad_rows(vocab, 5, "same")) == values(vocab));
}

TEST_CASE("a map read backwards renames, concatenates and pads") {
  const ArchMap map = parse_arch_map(R"({
    "indices": {"L": "layers"},
    "rules": [
      {"from": "emb", "to": "embed", "unpad": "vocab", "shape": ["vocab", 1]},
      {"from": "l.{L}.fc1", "to": ["l.{L}.gate", "l.{L}.up"], "split": {"sections": ["ffn", "ffn"]},
       "shapes": [["ffn", 1], ["ffn", 1]]}
    ],
    "back_none": ["l.{L}._extra_state"]})",
                                     "test", "test");
  CheckpointModel hf;
  hf.source = "hf";
  std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>> entries;
  for (auto t : {column("embed", 3, {}), column("l.0.gate", 2, {}, 10), column("l.0.up", 2, {}, 20)}) {
    entries.emplace_back(pickle::Value::str(t.name), make_tensor_ref(hf.tensors.size()));
    hf.tensors.push_back(t);
  }
  hf.root = pickle::Value::dict(entries);
  const ConfigFields config = {{"layers", 1}, {"vocab", 3}, {"ffn", 2}};
  CheckpointModel back = apply_arch_map_back(hf, map, config, "config.json", 4);
  std::vector<std::string> names;
  walk_leaves(*back.root, [&](const Leaf& leaf) { names.push_back(leaf.path); });
  CHECK(names == std::vector<std::string>{"emb", "l.0.fc1", "l.0._extra_state"});
  CHECK(values(back.tensors.at(0)) == std::vector<float>{0, 1, 2, 0});
  CHECK(values(back.tensors.at(1)) == std::vector<float>{10, 11, 20, 21});

  SECTION("a tensor no rule takes is refused, naming it") {
    hf.root->entries.emplace_back(pickle::Value::str("optimizer.exp_avg"), make_tensor_ref(0));
    CHECK_THROWS_WITH(apply_arch_map_back(hf, map, config, "config.json", 4),
                      Catch::Contains("optimizer.exp_avg") && Catch::Contains("optimizer"));
  }
  SECTION("a missing target is refused, naming it") {
    hf.root->entries.pop_back();
    CHECK_THROWS_WITH(apply_arch_map_back(hf, map, config, "config.json", 4), Catch::Contains("l.0.up"));
  }
}

namespace {

// A model of the named tensors, as a Hugging Face folder reads.
CheckpointModel folder_of(const std::vector<TensorEntry>& tensors) {
  CheckpointModel m;
  m.source = "hf";
  std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>> entries;
  for (const auto& t : tensors) {
    entries.emplace_back(pickle::Value::str(t.name), make_tensor_ref(m.tensors.size()));
    m.tensors.push_back(t);
  }
  m.root = pickle::Value::dict(entries);
  return m;
}

// `rows` x 1 tensors stacked as [slices, rows, 1], slice s numbered from s * 100.
TensorEntry fused_of(const std::string& name, int64_t slices, int64_t rows) {
  TensorEntry t;
  t.name = name;
  t.shape = {slices, rows, 1};
  for (int64_t s = 0; s < slices; ++s) place_slice(t, column("s", rows, {}, static_cast<float>(s * 100)), s);
  return t;
}

std::vector<std::string> names_of(const CheckpointModel& m) {
  std::vector<std::string> names;
  walk_leaves(*m.root, [&](const Leaf& leaf) { names.push_back(leaf.path); });
  return names;
}

}  // namespace

TEST_CASE("a stack read backwards gives each index of the fused tensor its own tensor, once") {
  const ConfigFields config = {{"layers", 1}, {"experts", 3}};
  const CheckpointModel hf = folder_of({fused_of("l.0.gate_up", 3, 2)});
  auto map_with = [](const std::string& index) {
    return parse_arch_map(R"({"indices": {"L": "layers", "E": "experts"},
      "rules": [{"from": "l.{L}.e.{E}.fc1", "to": "l.{L}.gate_up", "stack": ")" +
                              index + R"(", "shape": ["experts", 2, 1]}],
      "back_none": ["l.{L}.e.{E}._extra_state"]})",
                          "moe", "test");
  };
  CheckpointModel back = apply_arch_map_back(hf, map_with("E"), config, "config.json", 1);
  CHECK(names_of(back) == std::vector<std::string>{"l.0.e.0.fc1", "l.0.e.1.fc1", "l.0.e.2.fc1", "l.0.e.0._extra_state",
                                                   "l.0.e.1._extra_state", "l.0.e.2._extra_state"});
  for (std::size_t e = 0; e < 3; ++e) {
    CHECK(back.tensors[e].shape == Shape{2, 1});
    CHECK(values(back.tensors[e]) == std::vector<float>{100.0F * e, 100.0F * e + 1});
  }
  // The index is the map's expression: a reversed map reverses them back.
  back = apply_arch_map_back(hf, map_with("experts - 1 - E"), config, "config.json", 1);
  CHECK(values(back.tensors[0]) == std::vector<float>{200, 201});
  // An expression that takes an index twice leaves another no tensor: refused.
  CHECK_THROWS_WITH(apply_arch_map_back(hf, map_with("0 * E"), config, "config.json", 1),
                    Catch::Contains("index 0 of 'l.0.gate_up' would become two tensors"));
  // A fused tensor of another count than the config's: refused, naming the field.
  CHECK_THROWS_WITH(
      apply_arch_map_back(folder_of({fused_of("l.0.gate_up", 2, 2)}), map_with("E"), config, "config.json", 1),
      Catch::Contains("'l.0.gate_up'") && Catch::Contains("experts = 3"));
}

TEST_CASE("an unstack read backwards stacks the tensor of every index, and counts them") {
  const ArchMap map = parse_arch_map(R"({"indices": {"L": "layers", "E": "experts"},
    "rules": [{"from": "l.{L}.down", "to": "l.{L}.e.{E}.down", "unstack": "E", "shape": [2, 1]}]})",
                                     "moe", "test");
  const ConfigFields config = {{"layers", 1}, {"experts", 2}};
  CheckpointModel hf = folder_of({column("l.0.e.1.down", 2, {1}, 10), column("l.0.e.0.down", 2, {})});
  CheckpointModel back = apply_arch_map_back(hf, map, config, "config.json", 1);
  REQUIRE(names_of(back) == std::vector<std::string>{"l.0.down"});
  CHECK(back.tensors[0].shape == Shape{2, 2, 1});
  std::vector<float> v(4);
  assemble_rows(back.tensors[0], 0, 2, reinterpret_cast<std::byte*>(v.data()));
  CHECK(v == std::vector<float>{0, 1, 10, 11});
  SECTION("a missing index is named with the field that counts it") {
    CHECK_THROWS_WITH(apply_arch_map_back(folder_of({column("l.0.e.0.down", 2, {})}), map, config, "config.json", 1),
                      Catch::Contains("'l.0.e.1.down' is missing") && Catch::Contains("E = 1 of experts = 2"));
  }
  SECTION("an index past the config's count is named with the field") {
    hf = folder_of({column("l.0.e.0.down", 2, {}), column("l.0.e.1.down", 2, {}), column("l.0.e.2.down", 2, {})});
    CHECK_THROWS_WITH(apply_arch_map_back(hf, map, config, "config.json", 1),
                      Catch::Contains("'l.0.e.2.down'") && Catch::Contains("E = 2, past experts = 2"));
  }
}

TEST_CASE("holds_map_targets tells a fused folder from a per-expert one") {
  const ArchMap fused = parse_arch_map(R"({"indices": {"E": "experts"},
    "rules": [{"from": "e.{E}", "to": "gate_up", "stack": "E", "shape": ["experts", 2, 1]},
              {"from": "out", "to": "lm_head", "shape": [2, 1], "unless": "tied"}]})",
                                       "fused", "test");
  const ConfigFields config = {{"experts", 2}, {"tied", 1}};
  CHECK(holds_map_targets(folder_of({fused_of("gate_up", 2, 2)}), fused, config, "config.json"));
  CHECK_FALSE(holds_map_targets(folder_of({column("experts.0.w1", 2, {})}), fused, config, "config.json"));
  CHECK_FALSE(
      holds_map_targets(folder_of({fused_of("gate_up", 2, 2)}), fused, {{"experts", 2}, {"tied", 0}}, "config.json"));
}
