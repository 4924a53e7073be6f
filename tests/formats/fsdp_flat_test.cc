// Where FSDP1 puts parameters in a flat parameter (formats/fsdp_flat), against
// the numels FSDP itself recorded for the units of testdata/fsdp1 (their
// case.json: _numels_with_padding, padding entries included).
#include <catch2/catch.hpp>

#include "formats/fsdp_flat/flat_params.h"

using namespace ckpt;
using fsdp_flat::flat_offsets;

TEST_CASE("use_orig_params=False: parameters back to back, no padding", "[formats][fsdp_flat]") {
  // flat_adam_ws2's root unit: scale (3), emb.weight (11x6); its global numel 69 at any world size.
  auto f = flat_offsets({3, 66}, 0, 2);
  CHECK(f.offsets == std::vector<uint64_t>{0, 3});
  CHECK(f.total == 69);
  CHECK(flat_offsets({3, 66}, 0, 4).total == 69);
}

TEST_CASE("use_orig_params=True: 16-byte alignment, then the world size", "[formats][fsdp_flat]") {
  // orig_adamw_ws3, FSDP's numels: root [3, 1 pad, 66, 2 pad] = 72.
  auto root = flat_offsets({3, 66}, 4, 3);
  CHECK(root.offsets == std::vector<uint64_t>{0, 4});
  CHECK(root.total == 72);
  // blocks.0: [6, 2 pad, 54, 2 pad, 6, 2 pad] = 72.
  auto block = flat_offsets({6, 54, 6}, 4, 3);
  CHECK(block.offsets == std::vector<uint64_t>{0, 8, 64});
  CHECK(block.total == 72);
  // blocks.0.lin1: [54, 2 pad, 9, 1 pad] = 66.
  auto lin1 = flat_offsets({54, 9}, 4, 3);
  CHECK(lin1.offsets == std::vector<uint64_t>{0, 56});
  CHECK(lin1.total == 66);
  // proj: [36, 6] = 42, divisible by 3: no padding at all.
  CHECK(flat_offsets({36, 6}, 4, 3).total == 42);
  // the same unit at world size 4: 42 -> 44
  CHECK(flat_offsets({36, 6}, 4, 4).total == 44);
  // bf16 compute: 8-element alignment
  CHECK(flat_offsets({3, 66}, 8, 2).offsets == std::vector<uint64_t>{0, 8});
}
