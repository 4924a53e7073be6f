// One output folder made of several writers' folders and files copied
// whole, published as one: an Accelerate checkpoint (pytorch_model_fsdp_0/
// and optimizer_0/ as DCP directories, random_states_0.pkl, scheduler.bin,
// ... beside them). A PartedWriter like any other, so both drivers and both
// stores run it: locally everything goes into place with one directory
// rename; on s3:// the data objects of every folder first, then the copied
// files, then each folder's markers (DCP's .metadata) last, so that no part
// looks like a checkpoint before all of it is there.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "exec/parted_writer.h"

namespace ckpt {

class FoldersWriter final : public PartedWriter {
 public:
  struct Folder {
    std::string name;                      // below the output folder
    std::unique_ptr<PartedWriter> writer;  // whose one destination is <dir>/<name>
  };
  // `copied`: source files put beside the folders under their own names
  // (on s3:// one PUT each, or a multipart upload streamed from the file
  // when it is larger than a part).
  FoldersWriter(std::string dir, std::vector<Folder> folders, std::vector<std::string> copied);
  std::string kind() const override;
  std::vector<std::string> file_names() const override;
  std::vector<std::string> destinations() const override { return {dir_}; }
  std::string output_path(std::size_t k) const override;
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override;
  bool fills_files_in_order() const override;
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) override;
  bool publishes_to_object_store() const override;
  // The copied files (read whole), then every folder's markers in folder order.
  std::vector<MarkerFile> marker_files() const override;

 private:
  // Which folder file k belongs to, and its index there.
  std::pair<std::size_t, std::size_t> locate(std::size_t k) const;
  // Every folder's markers, in folder order.
  std::vector<MarkerFile> folder_markers() const;

  std::string dir_;
  std::vector<Folder> folders_;
  std::vector<std::string> copied_;
};

}  // namespace ckpt
