// The folder OUT.parts-<plan> that the workers of one --part run share (the
// shared output files, receipts, the request). It sits beside OUT, where
// someone else may have planted a link: a symlinked folder or entry would
// make a worker write through it, into an input or any file the user can
// write, and the finalizer publish the link as OUT. So the folder is made
// with mkdir (which never follows a link) or opened with O_NOFOLLOW, and
// each entry is opened relative to the folder's descriptor, O_NOFOLLOW, and
// checked: a regular file, owned by this user, with one link. Anything else
// is Unsafe (exit 3) naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {

class PartsFolder {
 public:
  // Makes the folder, or opens the one a sibling worker made.
  static PartsFolder create(const std::string& path);
  // The existing folder; nullopt when there is none at `path`.
  static std::optional<PartsFolder> open(const std::string& path);

  ~PartsFolder();
  PartsFolder(PartsFolder&& other) noexcept;
  PartsFolder& operator=(PartsFolder&&) = delete;
  PartsFolder(const PartsFolder&) = delete;
  PartsFolder& operator=(const PartsFolder&) = delete;

  const std::string& path() const { return path_; }
  std::string path_of(const std::string& name) const { return path_ + "/" + name; }

  // Opens entry `name` read-write (creating it, mode 0644, when `create`):
  // a descriptor the caller closes, or -1 with errno ENOENT when it is
  // absent and not created. Unsafe when it is not a regular file of this
  // user with one link; OutputFailed on other errors.
  int open_file(const std::string& name, bool create) const;
  // Entry `name` whole, read with the same checks; nullopt when absent.
  std::optional<std::string> read_file(const std::string& name) const;
  // Creates entry `name`, failing if anything (a link too) is there: false
  // with errno EEXIST when something is, ENOENT when the folder was removed.
  bool create_exclusive(const std::string& name) const;
  // Entry `name` replaced whole by `text`, atomically: written under a name
  // of this process ("name.<pid>", checked as open_file does) and renamed
  // over `name`, so that workers storing the same text at once each replace
  // it in one step. OutputFailed naming it on failure.
  void replace_file(const std::string& name, const std::string& text) const;
  // Removes entry `name` (best effort: false when it was not there).
  bool remove_file(const std::string& name) const;

 private:
  PartsFolder(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  int open_checked(const std::string& name, int flags) const;

  std::string path_;
  int fd_ = -1;
};

// Entries of a parts folder open read-write together for one pass (a --part
// run's shared output files), each opened as PartsFolder::open_file opens
// it; closed when destroyed.
class PartsFiles {
 public:
  // Opens each of `names`, creating it when `create`; DataLoss naming the
  // first one absent, followed by `when_missing`.
  PartsFiles(const PartsFolder& folder, const std::vector<std::string>& names, bool create,
             const std::string& when_missing);
  ~PartsFiles();
  PartsFiles(const PartsFiles&) = delete;
  PartsFiles& operator=(const PartsFiles&) = delete;

  std::size_t size() const { return fds_.size(); }
  int fd(std::size_t k) const { return fds_.at(k); }  // for positional writes (io/part_sink.h)
  const std::string& path(std::size_t k) const { return paths_.at(k); }

  // Up to `n` bytes of file k at `at` (a read interrupted is retried): how
  // many, 0 at its end. OutputFailed naming the file and `what` on an error.
  std::size_t read_at(std::size_t k, uint64_t at, void* buf, std::size_t n, const std::string& what) const;
  // File k cut (or extended) to `length`, then fsynced when `durable`.
  void set_length(std::size_t k, uint64_t length, bool durable) const;
  // File k's data sent to the disk (fdatasync).
  void sync_data(std::size_t k) const;
  // Bytes [begin, end) of file k, for each range (sorted), written to the
  // disk and waited for (sync_file_range), without fdatasync's flush of the
  // whole file: a --part worker's own bytes, while the other workers still
  // write theirs into the same file. Where sync_file_range is not supported,
  // fdatasync. OutputFailed naming the file on a write error.
  void write_back(std::size_t k, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const;

 private:
  std::vector<int> fds_;
  std::vector<std::string> paths_;
};

}  // namespace ckpt
