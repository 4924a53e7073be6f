// The traits jobs decide by (formats/source_traits.h): what each source
// kind answers, so a change to one is a deliberate, visible one.
#include <catch2/catch.hpp>

#include "formats/source_traits.h"

using namespace ckpt;

TEST_CASE("sharded sources reshard into their own layout; full state dicts need --layout", "[formats][traits]") {
  CHECK(source_traits(SourceKind::kDcpDir).reshard_layout == "dcp");
  CHECK(source_traits(SourceKind::kDcpPair).reshard_layout == "accelerate");
  CHECK(source_traits(SourceKind::kFsdpRanks).reshard_layout.empty());  // by the tensors: ShardedTensor or DTensor
  CHECK(source_traits(SourceKind::kMegatron).reshard_layout == "megatron");
  for (SourceKind k : {SourceKind::kDcpDir, SourceKind::kDcpPair, SourceKind::kFsdpRanks})
    CHECK(source_traits(k).sharded_layout);
  for (SourceKind k : {SourceKind::kTorchPt, SourceKind::kSafetensors, SourceKind::kSafetensorsIndex, SourceKind::kHdf5,
                       SourceKind::kZero})
    CHECK_FALSE(source_traits(k).sharded_layout);
}

TEST_CASE("per-rank families are read by --only; every other source is selected from", "[formats][traits]") {
  // Only the family's files are read; the other readers read everything
  // (ZeRO's model entry needs the optimizer files' fp32 masters) and
  // plan/select applies --only, as for a DCP directory.
  CHECK(source_traits(SourceKind::kFsdpRanks).reader_selects_only);
  CHECK_FALSE(source_traits(SourceKind::kZero).reader_selects_only);
  CHECK_FALSE(source_traits(SourceKind::kDsUniversal).reader_selects_only);
  CHECK_FALSE(source_traits(SourceKind::kMegatron).reader_selects_only);
  CHECK_FALSE(source_traits(SourceKind::kDcpDir).reader_selects_only);
  CHECK_FALSE(source_traits(SourceKind::kDcpPair).reader_selects_only);
  CHECK(source_traits(SourceKind::kFsdpRanks).per_rank_files);
  CHECK_FALSE(source_traits(SourceKind::kZero).per_rank_files);
}
