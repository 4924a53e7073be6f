#include "jobs/inspect.h"

#include "formats/detect.h"
#include "model/describe.h"

namespace ckpt::jobs {

JobReport run_inspect(const InspectRequest& req, std::ostream& out) {
  CheckpointModel model = read_checkpoint(req.common.source, {req.common.files, "", nullptr, req.common.tag, true});
  if (req.json)
    out << model_to_json(model).dump(2) << "\n";
  else
    describe_model(model, out);
  JobReport report;
  report.summary = "inspected " + model.source;
  report.tensors = model.tensors.size();
  report.dry_run = true;  // nothing written
  return report;
}

}  // namespace ckpt::jobs
