#include "jobs/inspect.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "formats/checkpoint_root.h"
#include "formats/detect.h"
#include "formats/zero/zero_reader.h"
#include "model/describe.h"
#include "model/validate.h"

namespace ckpt::jobs {

namespace {

// A folder of checkpoints with no --tag: what is in it, to choose from.
JobReport list_root(const InspectRequest& req, std::ostream& out) {
  std::vector<RootEntry> entries = list_checkpoints(req.common.source);
  if (req.json) {
    nlohmann::ordered_json j;
    j["root"] = req.common.source;
    j["checkpoints"] = nlohmann::ordered_json::array();
    for (const auto& e : entries)
      j["checkpoints"].push_back(
          {{"name", e.name},
           {"path", e.path},
           {"step", e.step ? nlohmann::ordered_json(*e.step) : nlohmann::ordered_json()},
           {"format", e.kind},
           {"world_size", e.world_size > 0 ? nlohmann::ordered_json(e.world_size) : nlohmann::ordered_json()},
           {"bytes", directory_bytes(e.path)},
           {"complete", e.complete},
           {"latest", e.latest},
           {"latest_universal", e.latest_universal}});
    out << j.dump(2) << "\n";
  } else {
    out << describe_root(req.common.source, entries);
  }
  JobReport report;
  report.summary = "listed the " + std::to_string(entries.size()) + " checkpoints in " + req.common.source;
  report.dry_run = true;
  return report;
}

// --tags: the names --tag accepts for SRC, one per line, `latest` first when
// SRC has a checkpoint it names (and `latest_universal` when a DeepSpeed
// root's file of that name names one); nothing for a single checkpoint.
JobReport list_tags(const InspectRequest& req, std::ostream& out) {
  std::vector<RootEntry> entries = list_checkpoints(req.common.source);
  if (!entries.empty()) out << "latest\n";
  if (std::any_of(entries.begin(), entries.end(), [](const RootEntry& e) { return e.latest_universal; }))
    out << "latest_universal\n";
  for (const auto& e : entries) out << e.name << "\n";
  JobReport report;
  report.summary = "listed " + std::to_string(entries.size()) + " tags of " + req.common.source;
  report.dry_run = true;
  return report;
}

// A chunk whose view does not fit its storage (a size, offset or stride
// past the record) is what torch.load refuses: inspect has shown what the
// file says, and exits as consolidate would (3) naming the tensor, so that
// `inspect && ...` does not pass a file no reader can load. Gaps are not
// checked here (one rank read alone has them); validate checks everything.
void refuse_unsound_views(const CheckpointModel& model) {
  for (const auto& t : model.tensors)
    visit_tensor_problems(t, [&](Problem p, bool gap) {
      if (!gap) fail_data_loss(model.source + ": " + p.message);
    });
}

// A shape torch cannot hold (a negative dimension, more than 2^63 - 1
// elements, bytes past 2^64) has no size to list: refused before listing.
void refuse_impossible_shapes(const CheckpointModel& model) {
  for (const auto& t : model.tensors)
    if (std::string p = tensor_shape_problem(t); !p.empty())
      fail_data_loss(model.source + ": tensor '" + t.name + "' of shape " + shape_str(t.shape) + " " + p);
}

}  // namespace

JobReport run_inspect(const InspectRequest& req, std::ostream& out) {
  if (req.tags) return list_tags(req, out);
  // A DeepSpeed folder is one checkpoint to its reader (the tag `latest`
  // names); holding several tags, it is listed like any folder of them.
  if (req.common.files.empty() && req.common.tag.empty() &&
      (is_checkpoint_root(req.common.source) ||
       (zero::is_deepspeed_root(req.common.source) && list_checkpoints(req.common.source).size() > 1)))
    return list_root(req, out);
  ReadOptions read = read_options(req.common);
  read.one_rank_alone = true;
  CheckpointModel model = read_checkpoint(req.common.source, read);
  if (!req.common.only.empty() || !req.common.keys.empty()) model = select_source(std::move(model), req.common);
  refuse_impossible_shapes(model);
  if (req.json)
    // A name pickled with a lone surrogate is not UTF-8: shown as U+FFFD, never an internal error.
    out << model_to_json(model).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else
    describe_model(model, out);
  refuse_unsound_views(model);
  JobReport report;
  report.summary = "inspected " + model.source;
  report.tensors = model.tensors.size();
  report.dry_run = true;  // nothing written
  return report;
}

}  // namespace ckpt::jobs
