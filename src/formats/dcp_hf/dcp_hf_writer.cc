#include "formats/dcp_hf/dcp_hf_writer.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace ckpt::dcp_hf {
namespace {

// Python's json.dumps defaults: ", " and ": " separators, non-ASCII escaped.
std::string python_json_string(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', true); }

std::string sharding_info(const std::vector<Piece>& pieces) {
  std::string out = "{";
  for (const auto& p : pieces) {
    if (out.size() > 1) out += ", ";
    out += python_json_string(p.fqn) + ": {\"saved_offsets\": [";
    for (std::size_t d = 0; d < p.offsets.size(); ++d) out += (d ? ", " : "") + std::to_string(p.offsets[d]);
    out += "]}";
  }
  return out + "}";
}

}  // namespace

std::string rank_file_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-model-00001-of-00001.safetensors", rank + 1);
  return buf;
}

safetensors::FilePlan plan_rank_file(int rank, const std::vector<Piece>& pieces) {
  std::vector<safetensors::FileMember> members;
  members.reserve(pieces.size());
  for (const auto& p : pieces) members.push_back({p.index, p.fqn, p.dtype, p.sizes});
  safetensors::FilePlan file = safetensors::plan_file(
      std::move(members), {{"DCP_SHARDING_INFO", sharding_info(pieces)}, {"DCP_VERSION", "1.0"}, {"format", "pt"}});
  file.file_name = rank_file_name(rank);
  return file;
}

}  // namespace ckpt::dcp_hf
