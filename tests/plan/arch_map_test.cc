#include <catch2/catch.hpp>

#include <cstring>

#include "core/error.h"
#include "exec/tensor_copy.h"
#include "model/tree_walk.h"
#include "plan/arch_map.h"

using namespace ckpt;

namespace {

// A float32 tensor of `rows` x `cols` whose element (r, c) is r * 100 + c,
// stored as one contiguous chunk per rank, split on dim 0 at `cuts`.
TensorEntry numbered(const std::string& name, int64_t rows, int64_t cols, const std::vector<int64_t>& cuts) {
  TensorEntry t;
  t.name = name;
  t.shape = cols ? Shape{rows, cols} : Shape{rows};
  const int64_t width = cols ? cols : 1;
  std::vector<int64_t> starts = {0};
  starts.insert(starts.end(), cuts.begin(), cuts.end());
  for (std::size_t i = 0; i < starts.size(); ++i) {
    int64_t r0 = starts[i], r1 = i + 1 < starts.size() ? starts[i + 1] : rows;
    std::vector<float> v;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < width; ++c) v.push_back(static_cast<float>(r * 100 + c));
    TensorChunk chunk;
    chunk.offsets = cols ? Shape{r0, 0} : Shape{r0};
    chunk.sizes = cols ? Shape{r1 - r0, cols} : Shape{r1 - r0};
    // Each rank's storage starts with 3 unrelated elements, as a shared storage's offset would.
    std::vector<float> stored = {-1, -1, -1};
    stored.insert(stored.end(), v.begin(), v.end());
    chunk.storage = make_memory_source(std::string(reinterpret_cast<const char*>(stored.data()), stored.size() * 4));
    chunk.storage_offset = 3;
    chunk.strides = contiguous_strides(chunk.sizes);
    chunk.rank = static_cast<int>(i);
    t.chunks.push_back(chunk);
  }
  return t;
}

// The row numbers (element (r, 0) / 100) of `t`, read through the executor's gather.
std::vector<int64_t> rows_of(const TensorEntry& t) {
  const int64_t width = t.shape.size() > 1 ? t.shape[1] : 1;
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  assemble_rows(t, 0, t.shape[0], reinterpret_cast<std::byte*>(v.data()));
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < t.shape[0]; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const float want = v[static_cast<std::size_t>(r * width)] + static_cast<float>(c);
      REQUIRE(v[static_cast<std::size_t>(r * width + c)] == want);  // whole rows moved, columns kept
    }
    rows.push_back(static_cast<int64_t>(v[static_cast<std::size_t>(r * width)]) / 100);
  }
  return rows;
}

ErrorCode code_of(const std::function<void()>& f, std::string& message) {
  try {
    f();
  } catch (const Error& e) {
    message = e.what();
    return e.code();
  }
  FAIL("no error");
  return ErrorCode::kInternal;
}

}  // namespace

TEST_CASE("arch map: split per query group picks each group's q, k, v rows across TP chunks", "[plan][arch_map]") {
  // 2 groups of [q q k v] (head_dim 1), written by two TP ranks (one group each).
  TensorEntry qkv = numbered("qkv", 8, 3, {4});
  CHECK(rows_of(gather_rows(qkv, split_runs(2, {2, 1, 1}, 0), "q")) == std::vector<int64_t>{0, 1, 4, 5});
  CHECK(rows_of(gather_rows(qkv, split_runs(2, {2, 1, 1}, 1), "k")) == std::vector<int64_t>{2, 6});
  TensorEntry v = gather_rows(qkv, split_runs(2, {2, 1, 1}, 2), "v");
  CHECK(v.name == "v");
  CHECK(v.shape == Shape{2, 3});
  CHECK(v.chunks.size() == 2);  // one piece of each rank's chunk, no byte read
  CHECK(rows_of(v) == std::vector<int64_t>{3, 7});
}

TEST_CASE("arch map: a section crossing a chunk boundary takes a piece of each chunk", "[plan][arch_map]") {
  TensorEntry fc1 = numbered("fc1", 12, 2, {6});  // [gate (5 rows); up (7 rows)], cut at row 6
  TensorEntry gate = gather_rows(fc1, split_runs(1, {5, 7}, 0), "gate");
  TensorEntry up = gather_rows(fc1, split_runs(1, {5, 7}, 1), "up");
  CHECK(gate.chunks.size() == 1);
  CHECK(up.chunks.size() == 2);
  CHECK(rows_of(gate) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(rows_of(up) == std::vector<int64_t>{5, 6, 7, 8, 9, 10, 11});
}

TEST_CASE("arch map: permute_rope takes each head's even rows, then its odd ones, with a doubled stride",
          "[plan][arch_map]") {
  // Two heads of head_dim 4, the chunks cut at an odd row (3) and a 1-D tensor.
  TensorEntry w = numbered("wq", 8, 2, {3});
  TensorEntry half = gather_rows(w, interleaved_to_half_runs(8, 4), "wq");
  CHECK(rows_of(half) == std::vector<int64_t>{0, 2, 1, 3, 4, 6, 5, 7});
  for (const auto& c : half.chunks) CHECK(c.strides[0] == (c.sizes[0] > 1 ? 4 : c.strides[0]));
  TensorEntry b = numbered("bq", 8, 0, {5});
  CHECK(rows_of(gather_rows(b, interleaved_to_half_runs(8, 4), "bq")) == std::vector<int64_t>{0, 2, 1, 3, 4, 6, 5, 7});
}

TEST_CASE("arch map: a run outside the tensor is refused", "[plan][arch_map]") {
  TensorEntry w = numbered("w", 4, 2, {});
  std::string msg;
  CHECK(code_of([&] { gather_rows(w, {{2, 2, 2}}, "x"); }, msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("'w'"));
}

namespace {

const char* kMap = R"({
  "source_kinds": ["pt"],
  "indices": {"L": "layers"},
  "defaults": {"head": "hidden / heads"},
  "rules": [
    {"from": "emb", "to": "embed", "unpad": "vocab", "shape": ["vocab", "hidden"]},
    {"from": ["l.{L}.qkv", "l.{L}.fused_qkv"], "to": ["q.{L}", "k.{L}", "v.{L}"],
     "split": {"groups": "groups", "sections": ["heads / groups * head", "head", "head"]},
     "shapes": [["heads * head", "hidden"], ["groups * head", "hidden"], ["groups * head", "hidden"]]}
  ],
  "skip": ["*._extra_state"]
})";

CheckpointModel model_of(std::vector<TensorEntry> tensors, const std::vector<std::string>& names) {
  CheckpointModel m;
  std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>> entries;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].name = names[i];
    entries.emplace_back(pickle::Value::str(names[i]), make_tensor_ref(i));
  }
  m.tensors = std::move(tensors);
  m.root = pickle::Value::dict(std::move(entries));
  return m;
}

}  // namespace

TEST_CASE("arch map: a model is renamed, split and unpadded as the config sizes it", "[plan][arch_map]") {
  ArchMap map = parse_arch_map(kMap, "test", "here");
  // hidden 2 (head 1 with 2 heads), 1 group: qkv rows [q q k v]; vocab 5 padded to 8.
  ConfigFields config = {{"layers", 2}, {"hidden", 2}, {"heads", 2}, {"groups", 1}, {"vocab", 5}};
  CheckpointModel m =
      model_of({numbered("", 8, 2, {4}), numbered("", 4, 2, {2}), numbered("", 4, 2, {}), numbered("", 4, 2, {})},
               {"emb", "l.0.qkv", "l.1.fused_qkv", "l.0.qkv._extra_state"});
  CheckpointModel out = apply_arch_map(m, map, config, "config.json");
  std::vector<std::string> names;
  walk_leaves(*out.root, [&](const Leaf& l) { names.push_back(l.path); });
  CHECK(names == std::vector<std::string>{"embed", "q.0", "k.0", "v.0", "q.1", "k.1", "v.1"});
  CHECK(out.tensors[0].shape == Shape{5, 2});
  CHECK(rows_of(out.tensors[0]) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(rows_of(out.tensors[2]) == std::vector<int64_t>{2});
  CHECK(rows_of(out.tensors[4]) == std::vector<int64_t>{0, 1});

  std::string msg;
  // The config says 3 heads: the qkv rows do not divide into its sections.
  config["heads"] = 4;
  config["hidden"] = 4;
  CHECK(code_of([&] { apply_arch_map(m, map, config, "config.json"); }, msg) == ErrorCode::kDataLoss);
  CHECK_THAT(msg, Catch::Contains("'emb'") || Catch::Contains("'embed'"));
  CHECK_THAT(msg, Catch::Contains("config.json"));
  // A shape the config does not give names the tensor and the field.
  config = {{"layers", 2}, {"hidden", 2}, {"heads", 2}, {"groups", 1}, {"vocab", 5}};
  CheckpointModel wide =
      model_of({numbered("", 8, 3, {}), numbered("", 4, 2, {}), numbered("", 4, 2, {})}, {"emb", "l.0.qkv", "l.1.qkv"});
  CHECK(code_of([&] { apply_arch_map(wide, map, config, "config.json"); }, msg) == ErrorCode::kDataLoss);
  CHECK_THAT(msg, Catch::Contains("'embed'") && Catch::Contains("hidden = 2") && Catch::Contains("(5, 3)"));
  // A missing layer, a vocabulary larger than the tensor, an unknown tensor.
  CheckpointModel short_model = model_of({numbered("", 8, 2, {}), numbered("", 4, 2, {})}, {"emb", "l.0.qkv"});
  CHECK(code_of([&] { apply_arch_map(short_model, map, config, "config.json"); }, msg) == ErrorCode::kNotFound);
  CHECK_THAT(msg, Catch::Contains("'l.1.qkv' or 'l.1.fused_qkv'"));
  config["vocab"] = 9;
  CHECK(code_of([&] { apply_arch_map(m, map, config, "config.json"); }, msg) == ErrorCode::kDataLoss);
  CHECK_THAT(msg, Catch::Contains("'emb'") && Catch::Contains("vocab = 9"));
  config["vocab"] = 5;
  CheckpointModel extra =
      model_of({numbered("", 8, 2, {}), numbered("", 4, 2, {}), numbered("", 4, 2, {}), numbered("", 2, 2, {})},
               {"emb", "l.0.qkv", "l.1.qkv", "l.0.other"});
  CHECK(code_of([&] { apply_arch_map(extra, map, config, "config.json"); }, msg) == ErrorCode::kUnimplemented);
  CHECK_THAT(msg, Catch::Contains("'l.0.other' matches no rule"));
  // A product past int64 is refused, never wrapped.
  ArchMap square = parse_arch_map(R"({"rules": [{"from": "emb", "to": "e", "shape": ["a * a", 2]}]})", "sq", "here");
  CheckpointModel one = model_of({numbered("", 8, 2, {})}, {"emb"});
  CHECK(code_of(
            [&] {
              apply_arch_map(one, square, {{"a", int64_t{1} << 32}}, "config.json");
            },
            msg) == ErrorCode::kDataLoss);
  CHECK_THAT(msg, Catch::Contains("'a * a' overflows"));
  // A checkpoint's name of 1 MB is matched without recursing per byte (std::regex overflowed the stack).
  CheckpointModel long_name =
      model_of({numbered("", 8, 2, {}), numbered("", 2, 2, {})}, {"emb", "l.0." + std::string(1 << 20, '1')});
  CHECK(code_of([&] { apply_arch_map(long_name, map, config, "config.json"); }, msg) == ErrorCode::kUnimplemented);
  config.erase("groups");
  CHECK(code_of([&] { apply_arch_map(m, map, config, "config.json"); }, msg) == ErrorCode::kNotFound);
  CHECK_THAT(msg, Catch::Contains("'groups'"));
}

TEST_CASE("arch map: a malformed map is a usage error naming the map and what is wrong", "[plan][arch_map]") {
  std::string msg;
  auto parse = [](const char* text) { return [text] { parse_arch_map(text, "mine", "mine.json"); }; };
  CHECK(code_of(parse("{"), msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("mine.json"));
  CHECK(code_of(parse(R"({"rules": [{"from": "a", "to": "b"}]})"), msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("shape"));
  CHECK(code_of(parse(R"({"rules": [{"from": "a", "to": "b", "shape": [1], "splt": {}}]})"), msg) ==
        ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("\"splt\""));
  CHECK(code_of(parse(R"({"rules": [{"from": "a.{L}", "to": "b.{L}", "shape": [1]}]})"), msg) ==
        ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("indices"));
  CHECK(code_of(parse(R"({"indices": {"L": 1}, "rules": [{"from": "a", "to": "b.{L}", "shape": [1]}]})"), msg) ==
        ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("does not capture"));
  CHECK(code_of(parse(R"({"extends": "nope", "rules": [{"from": "a", "to": "b", "shape": [1]}]})"), msg) ==
        ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("megatron-gpt-llama"));
}

TEST_CASE("arch map: the built-in maps parse and are found by source kind and architecture", "[plan][arch_map]") {
  REQUIRE(builtin_arch_maps().size() >= 3);
  const ArchMap* llama = builtin_arch_map_for("megatron-torch-dist", "LlamaForCausalLM");
  REQUIRE(llama);
  CHECK(llama->name == "megatron-gpt-llama");
  const ArchMap* qwen2 = builtin_arch_map_for("megatron-torch-dist", "Qwen2ForCausalLM");
  REQUIRE(qwen2);
  CHECK(qwen2->rules.size() == llama->rules.size() + 1);  // extends the Llama map
  CHECK(builtin_arch_map_for("dcp", "LlamaForCausalLM") == nullptr);
  CHECK(find_builtin_arch_map("megatron-gpt-qwen3"));
}

namespace {

// A stacked float32 tensor read whole through the executor's gather.
std::vector<float> values_of(const TensorEntry& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  assemble_rows(t, 0, t.shape[0], reinterpret_cast<std::byte*>(v.data()));
  return v;
}

}  // namespace

TEST_CASE("arch map: stack places each slice's chunks at its index of a new leading dim", "[plan][arch_map]") {
  // Three experts' [2 x 2] weights, the second written by two ranks (one row each); stacked out of order.
  std::vector<TensorEntry> experts = {numbered("e0", 2, 2, {}), numbered("e1", 2, 2, {1}), numbered("e2", 2, 2, {})};
  TensorEntry stacked;
  stacked.name = "gate_up";
  stacked.shape = {3, 2, 2};
  place_slice(stacked, experts[2], 2);
  place_slice(stacked, experts[0], 0);
  place_slice(stacked, experts[1], 1);
  CHECK(stacked.chunks.size() == 4);  // no chunk merged, no byte read
  for (const auto& c : stacked.chunks) CHECK((c.sizes[0] == 1 && c.offsets.size() == 3));
  // Element (e, r, c) of the stack is element (r, c) of expert e: r * 100 + c.
  CHECK(values_of(stacked) == std::vector<float>{0, 1, 100, 101, 0, 1, 100, 101, 0, 1, 100, 101});
  std::string msg;
  CHECK(code_of([&] { place_slice(stacked, numbered("wide", 2, 3, {}), 0); }, msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("'wide'") && Catch::Contains("'gate_up'"));
  CHECK(code_of([&] { place_slice(stacked, experts[0], 3); }, msg) == ErrorCode::kInvalidArgument);
}

TEST_CASE("arch map: unstack takes one index of the leading dim from the chunks that hold it", "[plan][arch_map]") {
  // A [4 x 3] tensor seen as 4 slices of [3], written by two ranks (rows 0-2 and 3).
  TensorEntry fused = numbered("down", 4, 3, {3});
  for (int64_t i = 0; i < 4; ++i) {
    TensorEntry s = slice_of(fused, i, "down." + std::to_string(i));
    CHECK(s.shape == Shape{3});
    REQUIRE(s.chunks.size() == 1);
    std::vector<float> v(3);
    assemble_rows(s, 0, 3, reinterpret_cast<std::byte*>(v.data()));
    const float r = static_cast<float>(i * 100);
    CHECK(v == std::vector<float>{r, r + 1, r + 2});
  }
  // Round trip: the slices stacked again read as the tensor.
  TensorEntry again;
  again.name = "again";
  again.shape = {4, 3};
  for (int64_t i = 3; i >= 0; --i) place_slice(again, slice_of(fused, i, "s"), i);
  CHECK(values_of(again) == values_of(fused));
  std::string msg;
  CHECK(code_of([&] { slice_of(fused, 4, "x"); }, msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("'down'"));
}

TEST_CASE("arch map: stack and unstack rules fill every expert of every layer once", "[plan][arch_map]") {
  ArchMap map = parse_arch_map(R"({
    "indices": {"L": "layers", "E": "experts"},
    "rules": [
      {"from": "l.{L}.e.{E}.fc1", "to": "l.{L}.gate_up", "stack": "E", "shape": ["experts", 2, 2]},
      {"from": "l.{L}.down", "to": "l.{L}.e.{E}.down", "unstack": "E", "shape": [2]}
    ]})",
                               "moe", "here");
  const ConfigFields config = {{"layers", 1}, {"experts", 2}};
  CheckpointModel m = model_of({numbered("", 2, 2, {}), numbered("", 2, 2, {1}), numbered("", 2, 2, {})},
                               {"l.0.e.1.fc1", "l.0.e.0.fc1", "l.0.down"});
  CheckpointModel out = apply_arch_map(m, map, config, "config.json");
  std::vector<std::string> names;
  walk_leaves(*out.root, [&](const Leaf& l) { names.push_back(l.path); });
  CHECK(names == std::vector<std::string>{"l.0.gate_up", "l.0.e.0.down", "l.0.e.1.down"});
  CHECK(out.tensors[0].shape == Shape{2, 2, 2});
  CHECK(out.tensors[2].shape == Shape{2});

  std::string msg;
  // An expert missing: the stacked tensor would hold uninitialised rows.
  CheckpointModel missing = model_of({numbered("", 2, 2, {}), numbered("", 2, 2, {})}, {"l.0.e.1.fc1", "l.0.down"});
  CHECK(code_of([&] { apply_arch_map(missing, map, config, "config.json"); }, msg) == ErrorCode::kNotFound);
  CHECK_THAT(msg, Catch::Contains("'l.0.gate_up' has no index 0"));
  // An expert the config does not count, a slice of another shape, a layer missing.
  CheckpointModel extra = model_of({numbered("", 2, 2, {}), numbered("", 2, 2, {}), numbered("", 2, 2, {})},
                                   {"l.0.e.0.fc1", "l.0.e.2.fc1", "l.0.down"});
  CHECK(code_of([&] { apply_arch_map(extra, map, config, "config.json"); }, msg) == ErrorCode::kDataLoss);
  CHECK_THAT(msg, Catch::Contains("'l.0.e.2.fc1' would be index 2") && Catch::Contains("experts = 2"));
  CheckpointModel wide = model_of({numbered("", 2, 3, {}), numbered("", 2, 2, {}), numbered("", 2, 2, {})},
                                  {"l.0.e.0.fc1", "l.0.e.1.fc1", "l.0.down"});
  CHECK(code_of([&] { apply_arch_map(wide, map, config, "config.json"); }, msg) == ErrorCode::kDataLoss);
  CHECK_THAT(msg, Catch::Contains("'l.0.e.0.fc1'") && Catch::Contains("'l.0.gate_up'"));
  CheckpointModel no_experts =
      model_of({numbered("", 2, 2, {}), numbered("", 2, 2, {}), numbered("", 2, 2, {}), numbered("", 2, 2, {})},
               {"l.0.e.0.fc1", "l.0.e.1.fc1", "l.0.down", "l.1.down"});
  CHECK(code_of(
            [&] {
              apply_arch_map(no_experts, map, {{"layers", 2}, {"experts", 2}}, "config.json");
            },
            msg) == ErrorCode::kNotFound);
  CHECK_THAT(msg, Catch::Contains("'l.1.gate_up' has no slice"));
  // Unstacking into a count the config does not give.
  CHECK(code_of(
            [&] {
              apply_arch_map(m, map, {{"layers", 1}, {"experts", 3}}, "config.json");
            },
            msg) == ErrorCode::kDataLoss);
  CHECK_THAT(msg, Catch::Contains("'l.0.down'"));
  // The index is an expression: a map may reverse the experts (a wrong map the logits proof must catch).
  ArchMap reversed = parse_arch_map(
      R"({"indices": {"E": "experts"},
          "rules": [{"from": "e.{E}", "to": "w", "stack": "experts - 1 - E", "shape": ["experts", 2, 2]}]})",
      "rev", "here");
  CheckpointModel two = model_of({numbered("", 2, 2, {}), numbered("", 2, 2, {1})}, {"e.0", "e.1"});
  CheckpointModel rev = apply_arch_map(two, reversed, {{"experts", 2}}, "config.json");
  REQUIRE(rev.tensors.size() == 1);
  CHECK(rev.tensors[0].chunks.size() == 3);
  CHECK(rev.tensors[0].chunks[0].offsets[0] == 1);  // e.0 at index 1
}

TEST_CASE("arch map: a malformed stack or unstack rule is a usage error", "[plan][arch_map]") {
  std::string msg;
  auto parse = [](const char* text) { return [text] { parse_arch_map(text, "mine", "mine.json"); }; };
  CHECK(code_of(parse(R"({"indices": {"E": 2}, "rules": [{"from": "a", "to": "b.{E}", "unstack": "E", "unpad": 1,
                          "shape": [1]}]})"),
                msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("one operation per rule"));
  CHECK(code_of(parse(R"({"indices": {"E": 2}, "rules": [{"from": "a", "to": "b", "unstack": "E", "shape": [1]}]})"),
                msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("does not use {E}"));
  CHECK(code_of(parse(R"({"rules": [{"from": "a", "to": "b.{F}", "unstack": "F", "shape": [1]}]})"), msg) ==
        ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("indices"));
  CHECK(code_of(parse(R"({"indices": {"E": 2}, "rules": [{"from": "a.{E}", "to": "b", "stack": "E", "shape": []}]})"),
                msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("stacked dim first"));
}

TEST_CASE("arch map: the MoE maps are built in, the per-expert ones by name only", "[plan][arch_map]") {
  const ArchMap* mixtral = builtin_arch_map_for("megatron-torch-dist", "MixtralForCausalLM");
  REQUIRE(mixtral);
  CHECK(mixtral->name == "megatron-gpt-mixtral");
  const ArchMap* qwen3moe = builtin_arch_map_for("megatron-torch-dist", "Qwen3MoeForCausalLM");
  REQUIRE(qwen3moe);
  CHECK(qwen3moe->name == "megatron-gpt-qwen3moe");

  for (const char* name : {"megatron-gpt-mixtral-per-expert", "megatron-gpt-qwen3moe-per-expert"}) {
    const ArchMap* m = find_builtin_arch_map(name);
    REQUIRE(m);
    CHECK(m->architectures.empty());
  }
}

TEST_CASE("arch map: a tie rule writes a second copy of a tensor another rule claims", "[plan][arch_map]") {
  // The embedding also written as the output layer when the config ties them (the tie rule listed first or last).
  ArchMap map = parse_arch_map(R"({"rules": [
    {"from": "emb", "to": "head", "tie": true, "unpad": "vocab", "shape": ["vocab", 2], "unless": "1 - tied"},
    {"from": "emb", "to": "embed", "unpad": "vocab", "shape": ["vocab", 2]},
    {"from": "out", "to": "head", "unpad": "vocab", "shape": ["vocab", 2], "unless": "tied"}]})",
                               "tie", "here");
  CheckpointModel m = model_of({numbered("", 8, 2, {4})}, {"emb"});
  CheckpointModel out = apply_arch_map(m, map, {{"vocab", 5}, {"tied", 1}}, "config.json");
  std::vector<std::string> names;
  walk_leaves(*out.root, [&](const Leaf& l) { names.push_back(l.path); });
  CHECK(names == std::vector<std::string>{"head", "embed"});
  CHECK(rows_of(out.tensors[0]) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(rows_of(out.tensors[1]) == rows_of(out.tensors[0]));
  std::string msg;
  // Untied, the tie is off and the output layer the source lacks is missing.
  CHECK(code_of(
            [&] {
              apply_arch_map(m, map, {{"vocab", 5}, {"tied", 0}}, "config.json");
            },
            msg) == ErrorCode::kNotFound);
  CHECK_THAT(msg, Catch::Contains("'out' is missing"));
  // Tied, an output layer of its own has no place; and a tie cannot stack.
  CheckpointModel both = model_of({numbered("", 8, 2, {}), numbered("", 8, 2, {})}, {"emb", "out"});
  CHECK(code_of(
            [&] {
              apply_arch_map(both, map, {{"vocab", 5}, {"tied", 1}}, "config.json");
            },
            msg) == ErrorCode::kDataLoss);
  CHECK(code_of(
            [] {
              parse_arch_map(R"({"indices": {"E": 2}, "rules": [{"from": "a.{E}", "to": "b", "stack": "E", "tie": true,
                                 "shape": [2, 2]}]})",
                             "mine", "mine.json");
            },
            msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("tie"));
}

TEST_CASE("arch map: skip_unless_zero leaves tensors out and reports them", "[plan][arch_map]") {
  std::string text = kMap;
  text.replace(text.find(R"("skip": ["*._extra_state"])"), std::string(R"("skip": ["*._extra_state"])").size(),
               R"("skip": ["*._extra_state"], "skip_unless_zero": {"l.{L}.bias": "shifts the routing"})");
  ArchMap map = parse_arch_map(text, "test", "here");
  REQUIRE(map.skip_unless_zero.size() == 1);
  ConfigFields config = {{"layers", 1}, {"hidden", 2}, {"heads", 2}, {"groups", 1}, {"vocab", 4}};
  CheckpointModel m = model_of({numbered("", 4, 2, {}), numbered("", 4, 2, {}), numbered("", 3, 1, {})},
                               {"emb", "l.0.qkv", "l.0.bias"});
  std::vector<DroppedTensor> dropped;
  CheckpointModel out = apply_arch_map(m, map, config, "config.json", &dropped);
  std::vector<std::string> names;
  walk_leaves(*out.root, [&](const Leaf& l) { names.push_back(l.path); });
  CHECK(names == std::vector<std::string>{"embed", "q.0", "k.0", "v.0"});
  REQUIRE(dropped.size() == 1);
  CHECK(dropped[0].tensor == 2);
  CHECK(dropped[0].why == "shifts the routing");
  std::string msg;
  CHECK(code_of(
            [&] {
              parse_arch_map(R"({"rules": [{"from": "a", "to": "b", "shape": ["n"]}], "skip_unless_zero": ["a"]})", "t",
                             "here");
            },
            msg) == ErrorCode::kInvalidArgument);
  CHECK_THAT(msg, Catch::Contains("skip_unless_zero"));
}
