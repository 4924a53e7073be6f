// Writes a Megatron-LM legacy checkpoint planned by
// formats/megatron_legacy/legacy_writer.h: a PartedWriter (exec/parted_output.h)
// whose files are the ranks' iter_<N>/mp_rank_*/model_optim_rng.pt, each a
// torch.save of its state dict with its tensor pieces gathered from the
// source's files; its publish adds latest_checkpointed_iteration.txt and
// renames the folder into place.
#pragma once

#include <string>
#include <vector>

#include "exec/parted_output.h"
#include "formats/megatron_legacy/legacy_writer.h"

namespace ckpt {

// The plan must outlive the writer.
class MegatronLegacyWriter final : public PartedWriter {
 public:
  MegatronLegacyWriter(const megatron_legacy::LegacyOutput& plan, std::string dir);
  std::string kind() const override { return "megatron-legacy"; }
  std::vector<std::string> file_names() const override;
  std::vector<std::string> destinations() const override { return {dir_}; }
  std::string output_path(std::size_t k) const override;
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override;
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override;
  bool publishes_to_object_store() const override { return true; }
  // The tracker, last: Megatron-LM's load_checkpoint reads it first.
  std::vector<MarkerFile> marker_files() const override;

 private:
  const megatron_legacy::LegacyOutput& plan_;
  std::string dir_;
};

}  // namespace ckpt
