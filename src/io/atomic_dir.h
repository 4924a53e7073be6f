// A directory output that appears complete or not at all: everything is
// written into "<dir>.tmp-XXXXXX/" beside it, and commit() renames that onto
// the destination (RENAME_NOREPLACE; with `force`, RENAME_EXCHANGE with the
// existing output, which is then removed). Destroyed uncommitted, it removes
// the temporary directory and never throws. Used by every multi-file output
// (DCP directories, per-rank files).
#pragma once

#include <string>

namespace ckpt {

// `dir` without trailing slashes ("out/" and "out" name one directory; "/" stays).
std::string without_trailing_slashes(std::string dir);

class AtomicDirectory {
 public:
  // InvalidArgument when `dir` exists and !force (nothing is created then);
  // OutputFailed when the temporary directory cannot be made.
  AtomicDirectory(std::string dir, bool force);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  // Path of `name` inside the temporary directory.
  std::string path_of(const std::string& name) const;
  // fsyncs the temporary directory and renames it into place. The files in
  // it must be complete (their own sinks finished) before.
  void commit();

  const std::string& destination() const { return dir_; }
  const std::string& temp_dir() const { return temp_; }

 private:
  std::string dir_;
  std::string temp_;
  bool force_;
  bool committed_ = false;
  int lock_fd_ = -1;  // the temporary directory, flock'ed while this run lives (io/temp_output.h)
};

}  // namespace ckpt
