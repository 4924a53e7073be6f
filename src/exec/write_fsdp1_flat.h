// Writes the FSDP1 flat-parameter files of a plan (formats/fsdp_flat/
// flat_writer.h) to `dir`: one torch.save file per rank and family, each
// tensor streamed from the source's chunks (and zero padding), the folder
// published whole or not at all.
#pragma once

#include "exec/parted_output.h"
#include "formats/fsdp_flat/flat_writer.h"

namespace ckpt {

// The plan's files in directory `dir`, a PartedWriter
// (exec/parted_output.h); the plan must outlive the writer.
class FlatWriter final : public PartedWriter {
 public:
  FlatWriter(const fsdp_flat::FlatPlan& plan, std::string dir);
  std::string kind() const override { return "fsdp1-flat"; }
  std::vector<std::string> file_names() const override;
  std::vector<std::string> destinations() const override { return {dir_}; }
  std::string output_path(std::size_t k) const override { return dir_ + "/" + plan_.files.at(k).path; }
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override;
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override;
  bool publishes_to_object_store() const override { return true; }  // no marker: the files are the checkpoint

 private:
  const fsdp_flat::FlatPlan& plan_;
  std::string dir_;
};

}  // namespace ckpt
