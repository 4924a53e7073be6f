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

#include <optional>
#include <string>

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

 private:
  PartsFolder(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  int open_checked(const std::string& name, int flags) const;

  std::string path_;
  int fd_ = -1;
};

}  // namespace ckpt
