#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "formats/fsdp_ranks/rank_merge.h"
#include "formats/rank_file_names.h"
#include "model/tensor_compare.h"

using namespace ckpt;
using namespace ckpt::fsdp_ranks;

TEST_CASE("veRL names give rank, world size, kind and a template") {
  auto n = parse_rank_file_name("optim_world_size_8_rank_3.pt");
  REQUIRE(n);
  CHECK(n->rank == 3);
  CHECK(n->world_size == 8);
  CHECK(n->kind == "optim");
  CHECK(n->tmpl == "optim_world_size_{N}_rank_{r}.pt");
  CHECK(n->name_for(5) == "optim_world_size_8_rank_5.pt");
  CHECK_FALSE(n->auxiliary);
  CHECK(parse_rank_file_name("extra_state_world_size_2_rank_0.pt")->auxiliary);
}

TEST_CASE("generic and Accelerate names give rank and kind, no world size") {
  auto m = parse_rank_file_name("model_rank12.pt");
  REQUIRE(m);
  CHECK(m->rank == 12);
  CHECK(m->world_size == -1);
  CHECK(m->kind == "model");
  CHECK(m->name_for(0) == "model_rank0.pt");
  auto a = parse_rank_file_name("pytorch_model_fsdp_rank1.bin");
  REQUIRE(a);
  CHECK(a->rank == 1);
  CHECK(a->kind == "model");
  CHECK(parse_rank_file_name("optimizer_rank-2.pt")->kind == "optim");
  CHECK(parse_rank_file_name("rank0.pt")->kind.empty());
}

TEST_CASE("names without a rank or with another extension are not rank files") {
  CHECK_FALSE(parse_rank_file_name("model_full.pt"));
  CHECK_FALSE(parse_rank_file_name("model_rank0.safetensors"));
  CHECK_FALSE(parse_rank_file_name("model_rank.pt"));
  CHECK_FALSE(parse_rank_file_name("model_rank99999999.pt"));
  CHECK(is_glob_pattern("ckpt/*rank*.pt"));
  CHECK_FALSE(is_glob_pattern("ckpt/model_rank0.pt"));
}

namespace {
// name -> (template, rank) for the files name_rank_files named.
std::map<std::string, std::pair<std::string, int>> named(const std::vector<std::string>& files,
                                                         std::vector<std::string>* unnamed = nullptr) {
  std::map<std::string, std::pair<std::string, int>> out;
  for (const auto& [path, n] : name_rank_files(files, unnamed)) out[path] = {n.tmpl, n.rank};
  return out;
}
}  // namespace

TEST_CASE("names that differ in one integer running over ranks from 0 are a numbered family") {
  auto m = named({"model_shard_0.pt", "model_shard_1.pt", "optimizer_shard_1.pt", "optimizer_shard_0.pt"});
  CHECK(m.at("model_shard_1.pt") == std::pair<std::string, int>("model_shard_{r}.pt", 1));
  CHECK(m.at("optimizer_shard_0.pt") == std::pair<std::string, int>("optimizer_shard_{r}.pt", 0));
  CHECK(named({"0.pt", "1.pt", "2.pt"}).at("2.pt").first == "{r}.pt");
  // the integer that varies, not the one that does not
  CHECK(named({"shard_0_of_2.pt", "shard_1_of_2.pt"}).at("shard_1_of_2.pt").first == "shard_{r}_of_2.pt");
  // zero padding is kept for the names of other ranks
  auto padded = name_rank_files({"ckpt-00.pt", "ckpt-01.pt"});
  REQUIRE(padded.size() == 2);
  CHECK(padded[0].second.name_for(7) == "ckpt-07.pt");
  CHECK(padded[0].second.kind.empty());
  CHECK(name_rank_files({"model_0.bin", "model_1.bin"})[0].second.kind == "model");
  // a keyword name keeps its own rule
  CHECK(named({"model_rank3.pt"}).at("model_rank3.pt").second == 3);
}

TEST_CASE("numbered names that are no family of ranks are left unnamed") {
  std::vector<std::string> unnamed;
  // one file; steps (no 0, or the largest at twice the count); a repeated number; another extension
  CHECK(named({"shard_0.pt"}, &unnamed).empty());
  CHECK(named({"step_100.pt", "step_200.pt"}, &unnamed).empty());
  CHECK(named({"step_0.pt", "step_4.pt"}, &unnamed).empty());
  CHECK(named({"a_0_x.pt", "a_0_x.pth"}, &unnamed).empty());
  CHECK(named({"w_0.safetensors", "w_1.safetensors"}, &unnamed).empty());
  CHECK(unnamed.size() == 9);
  // the boundary: ranks 0 and 3 of four files' worth is fine, 0 and 4 of two is not
  CHECK(named({"s_0.pt", "s_1.pt", "s_3.pt"}).size() == 3);
  CHECK(named({"s_0.pt", "s_4.pt"}).empty());
}

namespace {
TensorEntry plain(std::string bytes, Shape shape, Shape strides, int64_t storage_offset = 0) {
  TensorEntry t;
  t.dtype = DType::kUInt8;
  t.shape = shape;
  TensorChunk c;
  c.offsets.assign(shape.size(), 0);
  c.sizes = shape;
  c.strides = strides;
  c.storage_offset = storage_offset;
  c.storage = make_memory_source(std::move(bytes), "mem");
  t.chunks.push_back(c);
  return t;
}
}  // namespace

TEST_CASE("plain tensors compare by their elements, not their storage layout") {
  auto a = plain("abcd", {2, 2}, {2, 1});
  CHECK(same_tensor_bytes(a, plain("xabcd", {2, 2}, {2, 1}, 1)));
  CHECK(same_tensor_bytes(a, plain("acbd", {2, 2}, {1, 2})));  // transposed storage
  CHECK_FALSE(same_tensor_bytes(a, plain("abce", {2, 2}, {2, 1})));
  CHECK_FALSE(same_tensor_bytes(a, plain("abcd", {4}, {1})));
}
