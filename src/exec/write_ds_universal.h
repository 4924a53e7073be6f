// Writes a DeepSpeed universal checkpoint (formats/ds_universal/
// ds_universal_writer.h) to `dir`, the tag folder (<root>/<tag>_universal):
// one torch.save file per parameter and state, streamed from the source's
// chunks, the folder published whole or not at all, then
// <root>/latest_universal naming it, as ds_to_universal.py does. No
// temporary copy of the checkpoint: each tensor is read once; --part splits
// the files' tensors across processes.
#pragma once

#include <string>
#include <vector>

#include "exec/parted_output.h"
#include "exec/tensor_copy.h"
#include "formats/ds_universal/ds_universal_writer.h"
#include "model/checkpoint_model.h"

namespace ckpt {

// The universal checkpoint folder `dir`, a PartedWriter
// (exec/parted_output.h): every file of the plan; its publish renames the
// folder into place and writes latest_universal beside it. The model and
// the plan must outlive the writer.
class UniversalWriter final : public PartedWriter {
 public:
  // update_latest: replace an existing latest_universal (see write_latest).
  UniversalWriter(const CheckpointModel& model, const ds_universal::UniversalPlan& plan, std::string dir,
                  bool update_latest);
  std::string kind() const override { return "deepspeed-universal"; }
  std::vector<std::string> file_names() const override;
  std::vector<std::string> destinations() const override { return {dir_}; }
  std::string output_path(std::size_t k) const override;
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override;
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override;
  // On s3:// the tag's files are uploaded, then latest_universal is put
  // beside them last (the same rule as publish's for an existing one).
  bool publishes_to_object_store() const override { return true; }
  std::vector<MarkerFile> marker_files() const override;

 private:
  const ds_universal::UniversalPlan& plan_;
  std::string dir_;
  bool update_latest_;
  std::vector<std::vector<TensorEntry>> sources_;  // per file, the tensors as the copy engine reads them
};

}  // namespace ckpt
