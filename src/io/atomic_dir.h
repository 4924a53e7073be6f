// A directory output that appears complete or not at all: everything is
// written into "<dir>.tmp-XXXXXX/" beside it, and commit() renames that onto
// the destination (RENAME_NOREPLACE; with `force`, RENAME_EXCHANGE with the
// existing output, which is then removed). `durable`: the temporary directory
// is fsynced before the rename and its parent after (--no-fsync: neither).
// Destroyed uncommitted, it removes
// the temporary directory and never throws. Used by every multi-file output
// (DCP directories, per-rank files).
#pragma once

#include <string>

namespace ckpt {

// `dir` without trailing slashes ("out/" and "out" name one directory; "/" stays).
std::string without_trailing_slashes(std::string dir);

// A small file a directory output writes beside its data from memory: one
// copied from the source (Lightning's meta.pt, megatron-core's common.pt and
// metadata.json), or one a writer makes (the common.pt of a torch_dist
// checkpoint written from a Megatron-LM legacy one).
struct SideFile {
  std::string name;   // in the output directory
  std::string bytes;  // its whole content
};

// The file at `path` (through a file source, as every input is read: one
// linked out of the checkpoint is refused, io/containment.h) as a SideFile
// of the same name.
SideFile read_side_file(const std::string& path);

// fsyncs the directory holding `path`, so that an output just renamed into it
// survives a power loss (the rename is an entry of that directory, which the
// output's own fsync does not cover). Best effort, after the output is in
// place: a failure is logged, not thrown, as nothing is left to undo.
void sync_directory_of(const std::string& path);

// Renames the finished file `from` onto `to`, with RENAME_NOREPLACE unless
// `overwrite`: a file that appeared at `to` meanwhile is kept, and the
// output refused (InvalidArgument, "output exists"). OutputFailed otherwise.
void rename_into_place(const std::string& from, const std::string& to, bool overwrite);

class AtomicDirectory {
 public:
  // InvalidArgument when `dir` exists and !force (nothing is created then);
  // OutputFailed when the temporary directory cannot be made.
  AtomicDirectory(std::string dir, bool force, bool durable = true);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  // Path of `name` inside the temporary directory.
  std::string path_of(const std::string& name) const;
  // Renames the temporary directory into place (fsyncing it and the parent
  // when durable). The files in it must be complete (their own sinks finished) before.
  void commit();

  const std::string& destination() const { return dir_; }
  const std::string& temp_dir() const { return temp_; }

 private:
  std::string dir_;
  std::string temp_;
  bool force_;
  bool durable_;
  bool committed_ = false;
  int lock_fd_ = -1;  // the temporary directory, flock'ed while this run lives (io/temp_output.h)
};

}  // namespace ckpt
