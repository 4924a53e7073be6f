#include <catch2/catch.hpp>

#include "formats/fsdp_ranks/rank_file_names.h"
#include "formats/fsdp_ranks/rank_merge.h"

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
