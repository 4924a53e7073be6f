// Megatron-LM legacy checkpoints (formats/megatron_legacy): the TP layout
// rules, rank folder names, the optimizer layout rules, and where the merged
// model's and optimizer's bytes come from in the jobs Megatron-LM's own
// save_checkpoint wrote (testdata/megatron_legacy).
#include <catch2/catch.hpp>

#include "core/error.h"
#include "formats/megatron_legacy/legacy_reader.h"
#include "formats/megatron_legacy/legacy_writer.h"
#include "formats/megatron_legacy/optim_layout.h"
#include "formats/megatron_legacy/tp_layout.h"
#include "model/tree_walk.h"

using namespace ckpt;
using namespace ckpt::megatron_legacy;

namespace {

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

const TensorEntry& tensor_at(const CheckpointModel& m, const std::string& key) {
  pickle::ValuePtr v = mapping_of(m.root->get("model"))->get(key);
  REQUIRE(v);
  auto idx = tensor_ref_index(*v);
  REQUIRE(idx);
  return m.tensors.at(*idx);
}

}  // namespace

TEST_CASE("TP split rules follow megatron-core's layer kinds", "[formats][megatron_legacy]") {
  CHECK(tp_split_of("embedding.word_embeddings.weight", true) == TpSplit::kDim0);
  CHECK(tp_split_of("embedding.position_embeddings.weight", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_qkv.weight", true) == TpSplit::kDim0);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_qkv.bias", true) == TpSplit::kDim0);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_proj.weight", true) == TpSplit::kDim1);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_proj.bias", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.layers.0.mlp.linear_fc1.weight", true) == TpSplit::kGatedDim0);
  CHECK(tp_split_of("decoder.layers.0.mlp.linear_fc1.weight", false) == TpSplit::kDim0);
  CHECK(tp_split_of("decoder.layers.0.mlp.linear_fc2.weight", true) == TpSplit::kDim1);
  CHECK(tp_split_of("decoder.layers.0.mlp.linear_fc2.bias", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.layers.0.input_layernorm.weight", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.final_layernorm.bias", true) == TpSplit::kWhole);
  CHECK(tp_split_of("output_layer.weight", true) == TpSplit::kDim0);
  CHECK(tp_split_of("output_layer._extra_state", true) == TpSplit::kExtraState);
  // Unknown kinds are not guessed.
  CHECK_FALSE(tp_split_of("decoder.layers.0.mlp.router.weight", true));
  CHECK_FALSE(tp_split_of("decoder.layers.0.mlp.linear_fc1.scale", true));
  CHECK_FALSE(tp_split_of("weight", true));
}

TEST_CASE("rank folder names as get_checkpoint_name writes them", "[formats][megatron_legacy]") {
  CHECK(rank_folder_name(1, 0, 0, 1, 1) == "mp_rank_01");
  CHECK(rank_folder_name(1, 3, 0, 4, 1) == "mp_rank_01_003");
  CHECK(rank_folder_name(0, 1, 2, 2, 4) == "mp_rank_00_001_002");
  CHECK(rank_folder_name(123, 0, 0, 1, 1) == "mp_rank_123");
  auto n = parse_rank_folder("mp_rank_01_003");
  REQUIRE(n);
  CHECK(n->tp == 1);
  CHECK(n->second == 3);
  CHECK_FALSE(n->third);
  CHECK_FALSE(parse_rank_folder("mp_rank_"));
  CHECK_FALSE(parse_rank_folder("mp_rank_01_"));
  CHECK_FALSE(parse_rank_folder("mp_rank_0a"));
  CHECK_FALSE(parse_rank_folder("mp_rank_01_002_003_004"));
  CHECK_FALSE(parse_rank_folder("mp_rank_01_model_states.pt"));
}

TEST_CASE("the layer index is the first number after a `layers` component", "[formats][megatron_legacy]") {
  auto at = layer_index_in("decoder.layers.12.mlp.linear_fc1.weight");
  REQUIRE(at);
  CHECK(at->index == 12);
  CHECK(at->pos == 15);
  CHECK(at->len == 2);
  CHECK_FALSE(layer_index_in("decoder.final_layernorm.weight"));
  CHECK_FALSE(layer_index_in("decoder.sublayers.3.weight"));
}

TEST_CASE("merged TP pieces point into each rank's file", "[formats][megatron_legacy]") {
  CheckpointModel m = read_legacy(testdata("megatron_legacy/gpt_tp2pp2/ckpt/iter_0000007"), nullptr, "model");
  CHECK(m.info.kind == SourceKind::kMegatronLegacy);
  CHECK(m.info.files.size() == 4);
  // SwiGLU linear_fc1 of global layer 2 (stage 1's layer 0): [24, 8] from
  // each TP rank's [gate_r; up_r] of 12 rows: gate_0, gate_1, up_0, up_1.
  const TensorEntry& fc1 = tensor_at(m, "decoder.layers.2.mlp.linear_fc1.weight");
  CHECK(fc1.shape == Shape{24, 8});
  REQUIRE(fc1.chunks.size() == 4);
  CHECK(fc1.chunks[0].offsets == Shape{0, 0});
  CHECK(fc1.chunks[1].offsets == Shape{12, 0});
  CHECK(fc1.chunks[1].storage_offset == fc1.chunks[0].storage_offset + 6 * 8);
  CHECK(fc1.chunks[2].offsets == Shape{6, 0});
  CHECK(fc1.chunks[3].offsets == Shape{18, 0});
  CHECK(fc1.chunks[0].file.find("mp_rank_00_001") != std::string::npos);
  CHECK(fc1.chunks[2].file.find("mp_rank_01_001") != std::string::npos);
  // Row-parallel: on dim 1.
  const TensorEntry& proj = tensor_at(m, "decoder.layers.0.self_attention.linear_proj.weight");
  CHECK(proj.shape == Shape{8, 8});
  REQUIRE(proj.chunks.size() == 2);
  CHECK(proj.chunks[1].offsets == Shape{0, 4});
  // Whole on every TP rank: one chunk, TP rank 0's.
  const TensorEntry& norm = tensor_at(m, "decoder.final_layernorm.weight");
  REQUIRE(norm.chunks.size() == 1);
  CHECK(norm.chunks[0].file.find("mp_rank_00_001") != std::string::npos);
}

TEST_CASE("distrib_optim.pt buffers as megatron-core 0.16 lays them out", "[formats][megatron_legacy]") {
  // One chunk of fp32 parameters a, b, c and a bf16 one; a second chunk.
  std::vector<std::vector<LocalParam>> chunks = {{{"a", {3}, DType::kFloat32},
                                                  {"b", {2, 2}, DType::kFloat32},
                                                  {"h", {5}, DType::kBFloat16},
                                                  {"c", {100}, DType::kFloat32}},
                                                 {{"d", {70}, DType::kFloat32}}};
  std::vector<FlatBuffer> b = distopt_buffers_v016(chunks, /*grad_in_fp32=*/true, {});
  REQUIRE(b.size() == 3);  // chunk 0: fp32, then bf16 (first appearance); chunk 1: fp32
  // Reverse order, each start a multiple of 64: c [0, 100), b [128, 132), a [192, 195).
  CHECK(b[0].chunk == 0);
  CHECK(b[0].param_dtype == DType::kFloat32);
  REQUIRE(b[0].places.size() == 3);
  CHECK(b[0].places[0].param == 3);
  CHECK(b[0].places[0].start == 0);
  CHECK(b[0].places[1].param == 1);
  CHECK(b[0].places[1].start == 128);
  CHECK(b[0].places[2].param == 0);
  CHECK(b[0].places[2].start == 192);
  CHECK(b[0].numel_unpadded == 195);
  CHECK(b[1].param_dtype == DType::kBFloat16);
  CHECK(b[1].grad_dtype == DType::kFloat32);
  CHECK(b[1].numel_unpadded == 5);
  CHECK(b[2].chunk == 1);
  CHECK(b[2].numel_unpadded == 70);
  CHECK(distopt_buffers_v016(chunks, false, {})[1].grad_dtype == DType::kBFloat16);
  // Buckets of 100 elements in chunk 0: c fills the first (its 100
  // elements close it), b starts the next right where c ends, a is 64-aligned
  // within that bucket: 100 + 64 = 164.
  std::vector<FlatBuffer> cut = distopt_buffers_v016(chunks, true, {100, 0});
  CHECK(cut[0].places[0].start == 0);
  CHECK(cut[0].places[1].start == 100);
  CHECK(cut[0].places[2].start == 164);
  CHECK(cut[0].numel_unpadded == 167);
  CHECK(cut[2].numel_unpadded == 70);
  // A shared embedding (b) closes the bucket before it at its aligned start
  // (128) and one of its own after it: a then starts at 132, unaligned.
  chunks[0][1].shared_embedding = true;
  std::vector<FlatBuffer> shared = distopt_buffers_v016(chunks, true, {});
  CHECK(shared[0].places[1].start == 128);
  CHECK(shared[0].places[2].start == 132);
  CHECK(shared[0].numel_unpadded == 135);
  CHECK(no_weight_decay_v016({"x.bias", {4, 4}, DType::kFloat32}));
  CHECK(no_weight_decay_v016({"x.weight", {4}, DType::kFloat32}));
  CHECK_FALSE(no_weight_decay_v016({"x.weight", {4, 4}, DType::kFloat32}));
}

TEST_CASE("distrib_optim.pt's layout args: bucket sizes and the shared embedding", "[formats][megatron_legacy]") {
  using pickle::Value;
  auto args = [](std::vector<std::pair<const char*, pickle::ValuePtr>> kv) {
    pickle::ValuePtr d = Value::dict();
    for (auto& [k, v] : kv) d->entries.emplace_back(Value::str(k), v);
    return distopt_args_v016(*d);
  };
  auto chunk = [] {
    return std::vector<std::vector<LocalParam>>{{{"embedding.word_embeddings.weight", {40, 8}, DType::kFloat32},
                                                 {"decoder.layers.0.mlp.linear_fc1.weight", {24, 5}, DType::kFloat32},
                                                 {"output_layer.weight", {40, 8}, DType::kFloat32}}};
  };
  // Without overlap_grad_reduce one bucket, in reverse order: output layer
  // [0, 320), fc1 [320, 440), embeddings at the next multiple of 64: [448, 768).
  auto plain = chunk();
  DistoptArgs untied = args({{"untie_embeddings_and_output_weights", Value::boolean(true)}});
  CHECK(untied.dp == 1);
  CHECK(distopt_rank_buffers_v016(plain, untied, 0, 1)[0].numel_unpadded == 768);
  // ddp_bucket_size 100 on pipeline rank 0: every parameter closes its
  // bucket, so the embeddings start where fc1 ends (a bucket's end padding
  // is not saved); on pipeline rank 1 no bucketing.
  DistoptArgs cut = args({{"untie_embeddings_and_output_weights", Value::boolean(true)},
                          {"overlap_grad_reduce", Value::boolean(true)},
                          {"ddp_bucket_size", Value::integer(100)}});
  auto c0 = chunk(), c1 = chunk();
  CHECK(distopt_rank_buffers_v016(c0, cut, 0, 2)[0].places[2].start == 440);
  CHECK(distopt_rank_buffers_v016(c0, cut, 0, 2)[0].numel_unpadded == 760);
  CHECK(distopt_rank_buffers_v016(c1, cut, 1, 2)[0].places[2].start == 448);
  CHECK(distopt_rank_buffers_v016(c1, cut, 1, 2)[0].numel_unpadded == 768);
  // Tied at PP > 1: both embedding copies are the shared embedding (their
  // own buckets); at PP 1 neither is.
  auto tied = chunk(), tied_pp1 = chunk();
  distopt_rank_buffers_v016(tied, args({}), 0, 2);
  CHECK(tied[0][0].shared_embedding);
  CHECK(tied[0][2].shared_embedding);
  CHECK_FALSE(tied[0][1].shared_embedding);
  distopt_rank_buffers_v016(tied_pp1, args({}), 0, 1);
  CHECK_FALSE(tied_pp1[0][0].shared_embedding);
  // The default bucket size: max(40M, 1M x DP x CP).
  DistoptArgs dflt = args({{"overlap_grad_reduce", Value::boolean(true)}, {"data_parallel_size", Value::integer(64)}});
  CHECK(dflt.dp == 64);
  CHECK_FALSE(dflt.ddp_bucket_size);
}

TEST_CASE("the distributed optimizer's state per parameter points into distrib_optim.pt",
          "[formats][megatron_legacy]") {
  CheckpointModel m = read_legacy(testdata("megatron_legacy/gpt_tp2_dp2_distopt/ckpt/iter_0000005"), nullptr, "optim");
  pickle::ValuePtr state = mapping_of(mapping_of(m.root->get("optim"))->get("state"));
  auto chunk_of = [&](const std::string& name, const char* kind) {
    auto idx = tensor_ref_index(*mapping_of(state->get(name))->get(kind));
    REQUIRE(idx);
    return m.tensors.at(*idx);
  };
  // The last parameter comes first in the buffer; output_layer is split on
  // dim 0 over the two TP ranks' files.
  TensorEntry out = chunk_of("output_layer.weight", "exp_avg");
  CHECK(out.shape == Shape{16, 8});
  REQUIRE(out.chunks.size() == 2);
  CHECK(out.chunks[0].file.find("mp_rank_00/distrib_optim.pt") != std::string::npos);
  CHECK(out.chunks[0].storage_offset == 0);
  CHECK(out.chunks[1].file.find("mp_rank_01/distrib_optim.pt") != std::string::npos);
  CHECK(out.chunks[1].offsets == Shape{8, 0});
  // The first parameter (8 x 8 per rank) ends the 3648-element buffer.
  TensorEntry emb = chunk_of("embedding.word_embeddings.weight", "param");
  REQUIRE(emb.chunks.size() == 2);
  CHECK(emb.chunks[0].storage_offset == 3648 - 64);
}

namespace {

// The plan's rank file `name`'s model entry `key`, a tensor.
const TensorEntry& planned(const LegacyOutput& out, const std::string& name, const std::string& key) {
  for (const LegacyRankFile& f : out.files)
    if (f.name == name) {
      pickle::ValuePtr v = mapping_of(f.root->get("model"))->get(key);
      REQUIRE(v);
      auto idx = tensor_ref_index(*v);
      REQUIRE(idx);
      return f.tensors.at(*idx);
    }
  FAIL("no rank file " << name);
  throw;
}

}  // namespace

TEST_CASE("legacy writer: each rank's piece is the TP=1 tensor's rows or columns, stages renumbered",
          "[formats][megatron_legacy]") {
  CheckpointModel m = read_legacy(testdata("megatron_legacy/gpt_tp2pp2/ckpt/iter_0000007"), nullptr, "");
  LegacyOutput out = plan_legacy_output(m, nullptr, 2, 2);
  CHECK(out.tracker == "7");
  REQUIRE(out.files.size() == 4);
  CHECK(out.files[1].name == "iter_0000007/mp_rank_01_000/model_optim_rng.pt");
  CHECK(out.files[2].name == "iter_0000007/mp_rank_00_001/model_optim_rng.pt");
  // args say the new degrees; TP 2 x PP 2 is the source's own.
  pickle::ValuePtr args = mapping_of(out.files[0].root->get("args"));
  CHECK(args->get("tensor_model_parallel_size")->as_int() == 2);
  CHECK(args->get("pipeline_model_parallel_size")->as_int() == 2);
  // Rank (1, 1): global layer 3 as its layer 1; SwiGLU fc1 [gate_1; up_1]
  // from the TP=1 [gate; up] (24 rows), 6 rows each.
  const TensorEntry& fc1 =
      planned(out, "iter_0000007/mp_rank_01_001/model_optim_rng.pt", "decoder.layers.1.mlp.linear_fc1.weight");
  CHECK(fc1.shape == Shape{12, 8});
  REQUIRE(fc1.chunks.size() == 2);
  CHECK(fc1.chunks[0].offsets == Shape{0, 0});
  CHECK(fc1.chunks[1].offsets == Shape{6, 0});
  CHECK(fc1.chunks[0].sizes == Shape{6, 8});
  // Back where the reader found them: TP rank 1's own file, its gate then up rows.
  CHECK(fc1.chunks[0].file.find("mp_rank_01_001") != std::string::npos);
  CHECK(fc1.chunks[1].storage_offset == fc1.chunks[0].storage_offset + 6 * 8);
  // Row-parallel: columns 4..8.
  const TensorEntry& proj = planned(out, "iter_0000007/mp_rank_01_000/model_optim_rng.pt",
                                    "decoder.layers.0.self_attention.linear_proj.weight");
  CHECK(proj.shape == Shape{8, 4});
  // The first stage has no output layer, the last no embeddings.
  CHECK_FALSE(mapping_of(out.files[0].root->get("model"))->get("output_layer.weight"));
  CHECK_FALSE(mapping_of(out.files[3].root->get("model"))->get("embedding.word_embeddings.weight"));
  CHECK(mapping_of(out.files[3].root->get("model"))->get("output_layer.weight"));
}

TEST_CASE("legacy writer: what does not split is refused, naming it", "[formats][megatron_legacy]") {
  CheckpointModel m = read_legacy(testdata("megatron_legacy/gpt_tp2pp2/ckpt/iter_0000007"), nullptr, "");
  auto refused = [&](int tp, int pp, ErrorCode code, const std::string& text, int vpp = 1) {
    try {
      plan_legacy_output(m, nullptr, tp, pp, std::nullopt, vpp);
      FAIL("no error for TP " << tp << " x PP " << pp);
    } catch (const Error& e) {
      CHECK(e.code() == code);
      CHECK(e.message().find(text) != std::string::npos);
    }
  };
  refused(4, 1, ErrorCode::kUnimplemented, "query groups do not divide over TP 4");
  refused(1, 3, ErrorCode::kUnimplemented, "4 layers do not divide into 3 pipeline stages");
  refused(0, 1, ErrorCode::kInvalidArgument, "--tp, --pp and --vpp must be at least 1");
  refused(1, 1, ErrorCode::kInvalidArgument, "--vpp 2: virtual pipeline stages interleave over pipeline ranks", 2);
  refused(1, 4, ErrorCode::kUnimplemented, "4 layers do not divide into 8 virtual pipeline stages", 2);
  CheckpointModel only_model = read_legacy(testdata("megatron_legacy/gpt_tp2pp2/ckpt/iter_0000007"), nullptr, "model");
  try {
    plan_legacy_output(only_model, nullptr, 1, 1);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK(e.message().find("read whole") != std::string::npos);
  }
}

TEST_CASE("legacy writer: each rank's optimizer numbers its parameters group after group, states cut as weights",
          "[formats][megatron_legacy]") {
  const std::string dir = testdata("megatron_legacy/gpt_tp2pp2/ckpt/iter_0000007");
  CheckpointModel m = read_legacy(dir, nullptr, "");
  CheckpointModel optim = read_legacy(dir, nullptr, "optim");
  LegacyOutput out = plan_legacy_output(m, &optim, 2, 1);
  REQUIRE(out.files.size() == 2);
  const LegacyRankFile& rank1 = out.files[1];
  pickle::ValuePtr model = mapping_of(rank1.root->get("model"));
  pickle::ValuePtr opt = mapping_of(rank1.root->get("optimizer"));
  REQUIRE(opt);
  // FP32Optimizer: torch's state_dict alone (no fp32_from_fp16_params).
  CHECK_FALSE(opt->get("fp32_from_fp16_params"));
  const auto& groups = opt->at("param_groups")->as_sequence();
  REQUIRE(groups.size() == 2);
  // The default group's parameters first (2-d weights), then wd_mult 0's,
  // numbered on from where the first group ends; no group keeps a step.
  std::vector<std::string> weights, no_wd;
  for (const auto& [k, v] : model->entries)
    if (auto idx = tensor_ref_index(*v)) {
      const TensorEntry& t = rank1.tensors.at(*idx);
      const std::string name = k->as_str();
      (t.shape.size() == 1 || name.ends_with(".bias") ? no_wd : weights).push_back(name);
    }
  const auto& first = mapping_of(groups[0])->at("params")->as_sequence();
  const auto& second = mapping_of(groups[1])->at("params")->as_sequence();
  CHECK(first.size() == weights.size());
  CHECK(second.size() == no_wd.size());
  CHECK(second.front()->as_int() == static_cast<int64_t>(weights.size()));
  CHECK_FALSE(mapping_of(groups[0])->get("step"));
  CHECK(mapping_of(groups[1])->at("wd_mult")->as_number() == 0.0);
  // Layer 1's linear_fc1 (state index: its place among the weights): its
  // exp_avg is TP rank 1's [gate_1; up_1] of the TP=1 state, from the
  // source's TP rank 1 file of the first stage.
  std::size_t at = 0;
  while (weights.at(at) != "decoder.layers.1.mlp.linear_fc1.weight") ++at;
  pickle::ValuePtr state;
  for (const auto& [k, v] : mapping_of(opt->at("state"))->entries)
    if (k->is(pickle::Kind::kInt) && k->int_value == static_cast<int64_t>(at)) state = mapping_of(v);
  REQUIRE(state);
  const TensorEntry& exp_avg = rank1.tensors.at(*tensor_ref_index(*state->at("exp_avg")));
  CHECK(exp_avg.shape == Shape{12, 8});
  REQUIRE(exp_avg.chunks.size() == 2);
  CHECK(exp_avg.chunks[0].file.find("mp_rank_01_000") != std::string::npos);
  CHECK(exp_avg.chunks[1].offsets == Shape{6, 0});
  CHECK(rank1.tensors.at(*tensor_ref_index(*state->at("step"))).shape.empty());
}

TEST_CASE("legacy writer: a parameter the optimizer holds no state for is named", "[formats][megatron_legacy]") {
  const std::string dir = testdata("megatron_legacy/gpt_tp2pp2/ckpt/iter_0000007");
  CheckpointModel m = read_legacy(dir, nullptr, "");
  CheckpointModel optim = read_legacy(dir, nullptr, "optim");
  pickle::ValuePtr state = mapping_of(mapping_of(optim.root->get("optim"))->get("state"));
  std::erase_if(state->entries, [](const auto& e) { return e.first->as_str() == "decoder.final_layernorm.bias"; });
  try {
    plan_legacy_output(m, &optim, 1, 2);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK(e.message().find("holds no state for 'decoder.final_layernorm.bias'") != std::string::npos);
  }
}
