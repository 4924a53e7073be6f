#include "formats/source_traits.h"

namespace ckpt {

const SourceTraits& source_traits(SourceKind kind) {
  static const SourceTraits kFull{};
  static const SourceTraits kDcp{.sharded_layout = true, .reshard_layout = "dcp"};
  static const SourceTraits kAccelerate{.sharded_layout = true, .reshard_layout = "accelerate"};
  static const SourceTraits kRankFiles{.sharded_layout = true, .reader_selects_only = true, .per_rank_files = true};
  static const SourceTraits kDeepSpeed{.reader_selects_only = true};
  switch (kind) {
    case SourceKind::kDcpDir: return kDcp;
    case SourceKind::kDcpPair: return kAccelerate;
    case SourceKind::kFsdpRanks: return kRankFiles;
    case SourceKind::kZero: return kDeepSpeed;
    case SourceKind::kTorchPt:
    case SourceKind::kSafetensors:
    case SourceKind::kSafetensorsIndex:
    case SourceKind::kHdf5: return kFull;
  }
  return kFull;
}

}  // namespace ckpt
