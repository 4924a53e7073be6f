#include "jobs/finalize.h"

#include <spdlog/spdlog.h>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "exec/parted_output.h"
#include "exec/write_output.h"
#include "io/atomic_dir.h"
#include "io/s3_url.h"
#include "io/storage.h"
#include "jobs/consolidate.h"
#include "jobs/reshard.h"
#include "model/ordered_json.h"

namespace ckpt::jobs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

// The one folder of OUT's parts that holds a request; usage errors naming
// what to do otherwise.
std::string the_parts_folder(const std::string& output) {
  std::vector<std::string> found;
  for (const auto& f : parts_folders(output))
    if (stored_request(f)) found.push_back(f);
  if (found.empty())
    fail(ErrorCode::kDataLoss, output + ": no parts to finalize (no " + output +
                                   ".parts-*/ folder with a request.json): run the parts first (--part I/N)");
  if (found.size() > 1) {
    std::string list;
    for (const auto& f : found) list += "\n  " + f;
    fail_invalid(output + ": parts of " + std::to_string(found.size()) +
                 " different plans (the source or options changed between runs):" + list +
                 "\nremove the stale ones, or finalize with the worker's own command and --part finalize");
  }
  return found.front();
}

// -o DIR/: the workers wrote DIR/FILE (model.safetensors, full.pt, ...,
// by the format and what the model holds), and the parts are FILE's. OUT
// itself otherwise, or when no such file or several have parts.
std::string parted_file(const std::string& output) {
  if (output.empty() || output.back() != '/' || !is_directory(output)) return output;
  std::vector<std::string> found;
  for (const auto& f : output_formats())
    for (std::string_view name : {f.weights_file, f.full_file}) {
      const std::string file = without_trailing_slashes(output) + "/" + std::string(name);
      if (!parts_folders(file).empty()) found.push_back(file);
    }
  return found.size() == 1 ? found.front() : output;
}

// The request in OUT's parts folder must be for OUT: one naming another
// output (a planted or stale request.json) would make `finalize OUT` write
// there.
void require_same_output(const std::string& folder, const std::string& output, const std::string& cwd,
                         const ordered_json& request) {
  std::string named;
  try {
    named = request.at("output").get<std::string>();
  } catch (const json::exception& e) {
    fail(ErrorCode::kDataLoss, folder + "/request.json: not a request ckptconv wrote (" + e.what() + ")");
  }
  // An s3:// OUT names itself; a local one is relative to where the workers ran.
  const bool remote = is_s3_url(output) || is_s3_url(named);
  const std::string given = remote ? s3_url_string(parse_s3_url(output)) : resolved_path(output);
  const std::string theirs = remote ? (is_s3_url(named) ? s3_url_string(parse_s3_url(named)) : named)
                                    : resolved_path((fs::path(cwd) / named).string());
  if (given != theirs)
    fail(ErrorCode::kUnsafe, folder + "/request.json: its output is " + theirs + ", not " + given +
                                 " (the OUT given to finalize); refused");
}

}  // namespace

JobReport run_finalize(const FinalizeRequest& request, std::ostream& out) {
  FinalizeRequest req = request;
  req.output = parted_file(req.output);
  std::string folder = the_parts_folder(req.output);
  ordered_json j;
  std::string command, cwd;
  try {
    // Read as every JSON a checkpoint carries: someone else may have written it.
    j = parse_checkpoint_json(*stored_request(folder), folder + "/request.json");
    command = j.at("command").get<std::string>();
    cwd = j.at("cwd").get<std::string>();
  } catch (const std::exception& e) {
    fail(ErrorCode::kDataLoss, folder + "/request.json: not a request ckptconv wrote (" + e.what() + ")");
  }
  require_same_output(folder, req.output, cwd, j);
  // The workers' paths are relative to where they ran.
  if (!enter_directory(cwd))
    fail(ErrorCode::kDataLoss, folder + "/request.json: the workers ran in " + cwd + ", which is gone");
  spdlog::info("finalizing the {} of {} (parts in {}, run in {})", command, req.output, folder, cwd);
  try {
    if (command == "consolidate") {
      ConsolidateRequest c;
      c.common = common_options_from_json(j.at("common"));
      c.output = j.at("output").get<std::string>();
      c.format = j.at("format").get<std::string>();
      c.max_shard_size = j.at("max_shard_size").get<std::string>();
      c.compression = j.at("compression").get<std::string>();
      c.finite = j.at("finite").get<bool>();
      // Absent in requests of earlier versions. -o DIR/: run as the workers
      // ran, so that the folder's side files are published too.
      if (const std::string dir = j.value("folder", std::string()); !dir.empty()) {
        // Checked as the output is (require_same_output): the folder must be the one that holds it.
        if (without_trailing_slashes(dir) + "/" + fs::path(c.output).filename().string() != c.output)
          fail(ErrorCode::kUnsafe,
               folder + "/request.json: its folder " + dir + " does not hold its output " + c.output + "; refused");
        c.output = dir;
      }
      c.config_from = j.value("config_from", std::string());
      c.map = j.value("map", std::string());
      c.common.force = req.force;  // only from this command line, never from the stored request
      c.common.no_fsync = c.common.no_fsync || req.no_fsync;
      c.part = "finalize";
      return run_consolidate(c, out);
    }
    if (command == "reshard") {
      ReshardRequest r;
      r.common = common_options_from_json(j.at("common"));
      r.output = j.at("output").get<std::string>();
      if (!j.at("world_size").is_null()) r.world_size = j.at("world_size").get<int>();
      r.layout = j.at("layout").get<std::string>();
      if (j.contains("tp") && !j.at("tp").is_null()) r.tp = j.at("tp").get<int>();
      if (j.contains("pp") && !j.at("pp").is_null()) r.pp = j.at("pp").get<int>();
      if (j.contains("vpp") && !j.at("vpp").is_null()) r.vpp = j.at("vpp").get<int>();
      if (j.contains("distributed_optimizer") && !j.at("distributed_optimizer").is_null())
        r.distributed_optimizer = j.at("distributed_optimizer").get<bool>();
      r.mesh_device = j.at("mesh_device").get<std::string>();
      r.mesh_dim_names = j.at("mesh_dim_names").get<std::vector<std::string>>();
      r.update_latest = j.value("update_latest", false);
      if (j.contains("expert_parallel") && !j.at("expert_parallel").is_null())
        r.expert_parallel = j.at("expert_parallel").get<int>();
      r.map = j.value("map", std::string());  // absent in requests of earlier versions
      r.config_from = j.value("config_from", std::string());
      r.padded_vocab_multiple = j.value("padded_vocab_multiple", int64_t{128});
      r.args_from = j.value("args_from", std::string());
      r.common.force = req.force;  // only from this command line, never from the stored request
      r.common.no_fsync = r.common.no_fsync || req.no_fsync;
      r.part = "finalize";
      return run_reshard(r, out);
    }
  } catch (const json::exception& e) {
    fail(ErrorCode::kDataLoss, folder + "/request.json: not a request ckptconv wrote (" + e.what() + ")");
  }
  fail(ErrorCode::kDataLoss, folder + "/request.json: unknown command '" + command + "'");
}

}  // namespace ckpt::jobs
