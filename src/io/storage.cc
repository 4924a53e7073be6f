#include "io/storage.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/local_files.h"
#include "io/s3_storage.h"
#include "io/s3_url.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

EntryKind kind_of(mode_t mode) {
  if (S_ISREG(mode)) return EntryKind::kFile;
  if (S_ISDIR(mode)) return EntryKind::kDirectory;
  return EntryKind::kOther;
}

std::string joined(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// The POSIX file system. Every call is a plain syscall or a std::filesystem
// call on the path as given: relative paths are relative to the working
// directory, as the user typed them.
class LocalStorage final : public Storage {
 public:
  EntryStat stat(const std::string& path) const override {
    EntryStat out;
    struct stat st {};
    if (path.empty() || ::lstat(path.c_str(), &st) != 0) return out;
    out.link = S_ISLNK(st.st_mode);
    if (out.link && ::stat(path.c_str(), &st) != 0) return out;  // a dangling link: exists, kind kNone
    out.kind = kind_of(st.st_mode);
    out.size = out.kind == EntryKind::kFile ? static_cast<uint64_t>(st.st_size) : 0;
    out.device = static_cast<uint64_t>(st.st_dev);
    out.inode = static_cast<uint64_t>(st.st_ino);
    out.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    return out;
  }

  std::vector<DirEntry> list(const std::string& dir) const override {
    std::vector<DirEntry> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir.empty() ? "." : dir, ec), end; !ec && it != end; it.increment(ec)) {
      DirEntry e;
      e.name = it->path().filename().string();
      e.path = joined(dir, e.name);
      std::error_code kec;
      e.link = it->is_symlink(kec);
      // The entry's own questions use the type readdir gave (no stat per
      // name; a listing of a 1,200-file checkpoint costs one getdents), and
      // stat only a link, to follow it.
      if (it->is_regular_file(kec))
        e.kind = EntryKind::kFile;
      else if (kec.clear(); it->is_directory(kec))
        e.kind = EntryKind::kDirectory;
      else if (kec.clear(); it->exists(kec))
        e.kind = EntryKind::kOther;
      out.push_back(std::move(e));
    }
    std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    return out;
  }

  SourcePtr open(const std::string& path, bool mapped) const override {
    return mapped ? open_local_mapped(path) : open_local_file(path);
  }

  std::optional<std::string> local_path(const std::string& path) const override { return path; }

  std::string resolved(const std::string& path) const override {
    std::error_code ec;
    fs::path abs = fs::absolute(path, ec);
    if (ec) return path;
    fs::path canon = fs::weakly_canonical(abs, ec);
    return (ec ? abs.lexically_normal() : canon).string();
  }

  bool make_directory(const std::string& dir) const override {
    if (::mkdir(dir.c_str(), 0777) == 0) return true;
    int err = errno;
    if (err == EEXIST && stat(dir).is_directory()) return false;
    fail(ErrorCode::kOutputFailed, dir + ": cannot create the directory: " + std::strerror(err));
  }

  bool remove(const std::string& path) const override {
    std::error_code ec;
    return fs::remove(path, ec) && !ec;
  }

  void remove_tree(const std::string& path) const override {
    std::error_code ec;
    fs::remove_all(path, ec);  // remove_all never follows a link: it removes the link
  }

  void link_or_copy(const std::string& from, const std::string& to) const override {
    std::error_code ec;
    fs::create_hard_link(from, to, ec);
    if (!ec) return;
    ec.clear();
    fs::copy_file(from, to, ec);
    if (ec) fail(ErrorCode::kOutputFailed, "cannot copy " + from + " to " + to + ": " + ec.message());
  }

  void copy_link(const std::string& from, const std::string& to) const override {
    std::error_code ec;
    fs::copy_symlink(from, to, ec);
    if (ec) fail(ErrorCode::kOutputFailed, "cannot copy the link " + from + " to " + to + ": " + ec.message());
  }
};

}  // namespace

const Storage& storage_for(const std::string& path) {
  if (is_s3_url(path)) return s3_storage();
  static const LocalStorage local;
  return local;
}

SourcePtr open_file_source(const std::string& path) { return storage_for(path).open(path, false); }
SourcePtr open_mapped_source(const std::string& path) { return storage_for(path).open(path, true); }

std::string spool_directory() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? std::string(tmp) : std::string("/tmp");
}

bool enter_directory(const std::string& dir) { return ::chdir(dir.c_str()) == 0; }

std::string read_small_file(const std::string& path, uint64_t max_bytes) {
  SourcePtr src = open_file_source(path);
  if (src->size() > max_bytes)
    fail_invalid(path + ": " + std::to_string(src->size()) + " bytes, more than the " + std::to_string(max_bytes) +
                 " a file of its kind may have");
  return src->read_string(0, static_cast<std::size_t>(src->size()));
}

}  // namespace ckpt
