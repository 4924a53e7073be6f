// -o DIR/: consolidate's folder output (what save_pretrained, zero_to_fp32
// and `accelerate merge-weights` write into a folder) and how it appears.
//
// The weights file's family (the file, its shards <stem>-NNNNN-of-NNNNN<ext>
// and <file>.index.json) is what the output replaces:
// - DIR missing: the folder is built whole in DIR.tmp-XXXXXX/ beside it,
//   the source's side files (config.json, tokenizer files) copied in, and
//   renamed into place; missing parents are made, and removed again when the
//   job fails;
// - DIR holds none of the family: the files are written into DIR under
//   temporary names and renamed together at the end, the index last; side
//   files go in unless DIR has a file of that name (kept as it is);
// - DIR holds some of it (needs --force): DIR is rebuilt beside itself, the
//   new files and side files in, its other entries hard-linked in (copied
//   where a link is refused), and exchanged with it in one rename; the old
//   family is removed with the old folder. No reader sees the old model and
//   the new one mixed.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/atomic_dir.h"

namespace ckpt::jobs {

// The directories a job made (mkdir -p of `dir`), removed again unless kept:
// a failed or interrupted job leaves no new empty folder behind.
class CreatedDirectories {
 public:
  CreatedDirectories() = default;
  explicit CreatedDirectories(const std::string& dir);
  // The missing parents of the output `path` (a file or a folder).
  static CreatedDirectories parents_of(const std::string& path);
  CreatedDirectories(CreatedDirectories&& other) noexcept;
  CreatedDirectories& operator=(CreatedDirectories&& other) noexcept;
  ~CreatedDirectories();
  void keep() { made_.clear(); }

 private:
  std::vector<std::string> made_;
};

// --config-from DIR2: the files of DIR2 an output folder takes (config.json,
// generation_config.json, tokenizer files: every regular file that holds no
// weights, adapter_config.json aside), with `side_files` (the source's) whose
// names DIR2 lacks. InvalidArgument when DIR2 is no directory.
std::vector<std::string> side_files_with_config_from(const std::string& dir2,
                                                     const std::vector<std::string>& side_files);

// The names in `dir` of `file`'s family (see above), sorted.
std::vector<std::string> file_family_in(const std::string& dir, const std::string& file);

// What a config.json copied beside the weights is changed to say: their
// dtype (when the job cast or took its config from elsewhere: the top-level
// "torch_dtype" / "dtype", as save_pretrained records the dtype it saved,
// which from_pretrained's "auto" loads) and, where it has
// `transformers_weights`, the weights file written (the index when sharded).
struct ConfigEdits {
  std::optional<DType> dtype;
  std::string weights_name;
};

// -o s3://BUCKET/DIR/: after the weights (their objects, index last; the
// writer's publish_beside step, by the one process or the --part finalizer)
// the side files are put beside them as OutputFolder::publish copies them:
// config.json edited as `config_edits` says and last, which makes the
// folder a model for from_pretrained; a file DIR has already is kept as it
// is (a config.json kept is edited the same way and put over itself),
// unless `replacing` (the weights replace a model there, --force: the
// source's side files go over the old ones, as the local folder is rebuilt). On
// failure the side objects put are deleted again (the caller deletes the
// weights). Returns their URLs.
std::vector<std::string> publish_side_objects(const std::string& dir, const std::vector<std::string>& side_files,
                                              const ConfigEdits& config_edits, bool replacing);

// Copies `side_files` into the folder `into` (messages name them as in
// `shown_dir`), config.json last (what makes a folder a model for
// from_pretrained) and edited as `config_edits` says; a file already there
// is kept as it is (a config.json kept is edited the same way). The
// finalizing --part worker copies them into DIR after the weights are in
// place; OutputFolder::publish into its staging folder.
void copy_folder_side_files(const std::string& into, const std::string& shown_dir,
                            const std::vector<std::string>& side_files, const ConfigEdits& config_edits, bool durable);

class OutputFolder {
 public:
  // InvalidArgument when DIR holds the family and !force (nothing is made then).
  OutputFolder(const std::string& dir, const std::string& file, bool force, bool durable);
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

  // Where the writer writes the weights file.
  std::string file_path() const;
  // `path`, written under file_path()'s folder, as it will be named once published.
  std::string published_path(const std::string& path) const;
  // Copies `side_files` in, carries DIR's other entries when replacing, and
  // publishes. The weights files must be complete. The config.json copied
  // in, or the one DIR kept, is edited as `config_edits` says.
  void publish(const std::vector<std::string>& side_files, const ConfigEdits& config_edits);

 private:
  std::string dir_, file_;
  bool durable_;
  CreatedDirectories parents_;
  std::unique_ptr<AtomicDirectory> staging_;  // none: written into the existing DIR
  std::vector<std::string> replaced_;         // the family's names in DIR when replacing
};

}  // namespace ckpt::jobs
