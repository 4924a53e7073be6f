#include "jobs/requests.h"

#include "io/storage.h"

namespace ckpt::jobs {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Where this process runs: the workers' paths are relative to it.
std::string here() { return resolved_path("."); }

json common_json(const CommonOptions& o) {
  return {{"source", o.source},
          {"files", o.files},
          {"tag", o.tag},
          {"param_layout", o.param_layout},
          {"only", o.only},
          {"keys", o.keys},
          {"exclude_frozen", o.exclude_frozen},
          {"dtype", o.dtype},
          {"device", o.device},
          {"threads", o.threads},
          {"memory_limit", o.memory_limit},
          {"force", o.force},
          {"no_fsync", o.no_fsync},
          {"no_verify", o.no_verify},
          {"max_output_size", o.max_output_size}};
}

}  // namespace

CommonOptions common_options_from_json(const ordered_json& j) {
  CommonOptions o;
  o.source = j.at("source").get<std::string>();
  o.files = j.at("files").get<std::vector<std::string>>();
  o.tag = j.at("tag").get<std::string>();
  o.param_layout = j.value("param_layout", "");  // absent in requests of earlier versions
  o.only = j.at("only").get<std::string>();
  o.keys = j.at("keys").get<std::string>();
  o.exclude_frozen = j.value("exclude_frozen", false);  // absent in requests of earlier versions
  o.dtype = j.at("dtype").get<std::string>();
  o.device = j.at("device").get<std::string>();
  o.threads = j.at("threads").get<int>();
  o.memory_limit = j.at("memory_limit").get<std::string>();
  o.force = j.at("force").get<bool>();
  o.no_fsync = j.at("no_fsync").get<bool>();
  o.no_verify = j.at("no_verify").get<bool>();
  o.max_output_size = j.at("max_output_size").get<std::string>();
  return o;
}

std::string request_json(const ConsolidateRequest& r, const std::string& folder) {
  json j = {{"command", "consolidate"},     {"cwd", here()},      {"common", common_json(r.common)},
            {"output", r.output},           {"format", r.format}, {"max_shard_size", r.max_shard_size},
            {"compression", r.compression}, {"finite", r.finite}, {"folder", folder},
            {"config_from", r.config_from}, {"map", r.map}};
  return j.dump(1);
}

std::string request_json(const ReshardRequest& r) {
  json j = {{"command", "reshard"},
            {"cwd", here()},
            {"common", common_json(r.common)},
            {"output", r.output},
            {"world_size", r.world_size ? json(*r.world_size) : json(nullptr)},
            {"layout", r.layout},
            {"tp", r.tp ? json(*r.tp) : json(nullptr)},
            {"pp", r.pp ? json(*r.pp) : json(nullptr)},
            {"vpp", r.vpp ? json(*r.vpp) : json(nullptr)},
            {"distributed_optimizer", r.distributed_optimizer ? json(*r.distributed_optimizer) : json(nullptr)},
            {"mesh_device", r.mesh_device},
            {"mesh_dim_names", r.mesh_dim_names},
            {"update_latest", r.update_latest},
            {"expert_parallel", r.expert_parallel ? json(*r.expert_parallel) : json(nullptr)},
            {"map", r.map},
            {"config_from", r.config_from},
            {"padded_vocab_multiple", r.padded_vocab_multiple},
            {"args_from", r.args_from}};
  return j.dump(1);
}

}  // namespace ckpt::jobs
