#include "model/source_info.h"

namespace ckpt {

const char* source_kind_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::kTorchPt: return "torch.save file";
    case SourceKind::kDcpDir: return "DCP directory";
    case SourceKind::kFsdpRanks: return "per-rank files";
    case SourceKind::kSafetensors: return "safetensors file";
    case SourceKind::kSafetensorsIndex: return "sharded safetensors (index)";
    case SourceKind::kHdf5: return "HDF5 file";
    case SourceKind::kZero: return "DeepSpeed ZeRO checkpoint";
    case SourceKind::kDcpPair: return "DCP model and optimizer directories (Accelerate)";
    case SourceKind::kHfFolder: return "Hugging Face model folder";
    case SourceKind::kDcpHf: return "DCP Hugging Face directory (per-rank safetensors)";
    case SourceKind::kDsUniversal: return "DeepSpeed universal checkpoint";
    case SourceKind::kMegatron: return "Megatron-core torch_dist checkpoint";
    case SourceKind::kHfBinFolder: return "Hugging Face model folder (pytorch_model.bin)";
    case SourceKind::kMegatronLegacy: return "Megatron-LM legacy (torch) checkpoint";
  }
  return "?";
}

const char* source_format_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::kTorchPt: return "pt";
    case SourceKind::kDcpDir: return "dcp";
    case SourceKind::kFsdpRanks: return "fsdp-ranks";
    case SourceKind::kSafetensors:
    case SourceKind::kSafetensorsIndex:
    case SourceKind::kHfFolder: return "safetensors";
    case SourceKind::kHdf5: return "hdf5";
    case SourceKind::kZero: return "deepspeed-zero";
    case SourceKind::kDcpPair: return "dcp-pair";
    case SourceKind::kDcpHf: return "dcp-hf";
    case SourceKind::kDsUniversal: return "deepspeed-universal";
    case SourceKind::kMegatron: return "megatron-torch-dist";
    case SourceKind::kHfBinFolder: return "pt";
    case SourceKind::kMegatronLegacy: return "megatron-legacy";
  }
  return "?";
}

const char* storage_kind_name(StorageKind kind) {
  switch (kind) {
    case StorageKind::kTensor: return "tensor";
    case StorageKind::kParameter: return "Parameter";
    case StorageKind::kShardedTensor: return "ShardedTensor";
    case StorageKind::kDTensor: return "DTensor";
    case StorageKind::kBuffer: return "buffer";
  }
  return "?";
}

}  // namespace ckpt
