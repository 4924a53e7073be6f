// torch's DCP Hugging Face layout: per-rank safetensors with DCP_SHARDING_INFO.
#include "formats/dcp_hf/dcp_hf_reader.h"
#include "formats/input_format.h"

namespace ckpt::dcp_hf {
namespace {

// A refinement of a Hugging Face folder (it holds .safetensors files too).
int probe_dir(const std::string& dir) { return is_dcp_hf_dir(dir) ? confidence::kRefines : confidence::kNo; }

CheckpointModel read(const std::string& src, const ReadOptions& options) {
  return read_dcp_hf_dir(src, options.problems);
}

}  // namespace

const InputFormat& input_format() {
  // Resharded, it stays in its own layout (--layout dcp for a plain DCP directory).
  static const InputFormat f{.kind = SourceKind::kDcpHf,
                             .probe_directory = probe_dir,
                             .read = read,
                             .traits = {.sharded_layout = true, .reshard_layout = "hf"},
                             .directory_shape = "DCP Hugging Face shard-*.safetensors with DCP_SHARDING_INFO",
                             .description =
                                 "torch's DCP Hugging Face layout, shard-*.safetensors with "
                                 "DCP_SHARDING_INFO"};
  return f;
}

}  // namespace ckpt::dcp_hf
