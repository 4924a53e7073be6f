// The storage layer: the one way the rest of ckptconv lists, stats, opens,
// creates and removes anything. Readers, probes, checks, jobs and writers
// name paths; where those paths live is decided here, by the `Storage`
// that storage_for() picks for a path (LocalStorage, the POSIX file system,
// and for s3:// URLs the S3 backend of io/s3_storage.h). The containment rule (io/containment.h,
// --follow-links) is applied by every open, so no caller can read a file a
// checkpoint folder links out to by going another way.
//
// A backend (object storage: s3://bucket/prefix, io/s3_backend.cc) is one file
// implementing Storage: stat and list by prefix, open as a ByteSource doing
// ranged reads. Outputs to object storage do not go through the calls
// below (there is no rename to publish with): the output driver uploads
// them (exec/parted_output.h, io/s3_upload.h). local_path() is optional: callers that need a local file
// (copy_file_range, libhdf5) ask for it and fall back, or refuse by name,
// when a backend has none. docs/architecture.md has the recipe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/byte_source.h"

namespace ckpt {

enum class EntryKind { kNone, kFile, kDirectory, kOther };

// What stat() learns about a path. `kind` follows symbolic links (a link to
// a file is a file); `link` says the name itself is one.
struct EntryStat {
  EntryKind kind = EntryKind::kNone;
  bool link = false;
  uint64_t size = 0;  // files only
  // Identity: two names of one file have equal (device, inode).
  uint64_t device = 0;
  uint64_t inode = 0;
  // Last modification, nanoseconds since the epoch: with `size`, whether a
  // file changed between two looks.
  int64_t mtime_ns = 0;

  // The name is there (a dangling link included, as lstat sees it).
  bool exists() const { return kind != EntryKind::kNone || link; }
  // The name leads to something (links followed, as std::filesystem::exists).
  bool resolves() const { return kind != EntryKind::kNone; }
  bool is_file() const { return kind == EntryKind::kFile; }
  bool is_directory() const { return kind == EntryKind::kDirectory; }
};

// One name in a directory listing; `path` is the directory joined with it.
// `kind` follows links, as EntryStat's does.
struct DirEntry {
  std::string name;
  std::string path;
  EntryKind kind = EntryKind::kNone;
  bool link = false;

  bool is_file() const { return kind == EntryKind::kFile; }
  bool is_directory() const { return kind == EntryKind::kDirectory; }
};

class Storage {
 public:
  virtual ~Storage() = default;

  // ---- reading ----
  // kNone when the path does not exist or cannot be looked at. A local
  // stat never throws; a remote one throws when the service cannot answer
  // (unreachable, access denied, no such bucket): kNone would hide why.
  virtual EntryStat stat(const std::string& path) const = 0;
  // The names in `dir`, sorted bytewise (so every run sees one order); empty
  // when `dir` is not a readable directory. "." and ".." are never listed.
  virtual std::vector<DirEntry> list(const std::string& dir) const = 0;
  // For positional reads; NotFound when missing, Unsafe when it escapes its
  // checkpoint folder (io/containment.h), Unimplemented when not a regular
  // file. `mapped`: all bytes addressable (data()) where the backend can.
  virtual SourcePtr open(const std::string& path, bool mapped) const = 0;
  // The path as a local file for APIs that need one (copy_file_range,
  // libhdf5); nullopt on a backend without local files.
  virtual std::optional<std::string> local_path(const std::string& path) const = 0;
  // Absolute, symlinks resolved where they exist ("a/../b" made lexical past
  // the first missing component): to compare two paths naming one place.
  virtual std::string resolved(const std::string& path) const = 0;

  // ---- writing outputs ----
  // Makes `dir` (not its parents); false when it already existed as a
  // directory; OutputFailed naming it otherwise.
  virtual bool make_directory(const std::string& dir) const = 0;
  // Removes a file, a link or an empty directory; false when it was not there
  // or could not be removed (best effort: used to undo).
  virtual bool remove(const std::string& path) const = 0;
  // Removes a tree (best effort; links are removed, never followed).
  virtual void remove_tree(const std::string& path) const = 0;
  // `to` as a copy of the file `from`: a hard link where the backend can (no
  // bytes copied), else the bytes. OutputFailed naming both on failure.
  virtual void link_or_copy(const std::string& from, const std::string& to) const = 0;
  // A symbolic link at `to` saying what `from` says (never followed).
  virtual void copy_link(const std::string& from, const std::string& to) const = 0;
};

// The storage holding `path`: the S3 backend for "s3://...", else LocalStorage.
const Storage& storage_for(const std::string& path);

// Shorthands through storage_for(path), for the common questions.
inline EntryStat stat_path(const std::string& path) { return storage_for(path).stat(path); }
inline bool path_exists(const std::string& path) { return stat_path(path).exists(); }
inline bool is_directory(const std::string& path) { return stat_path(path).is_directory(); }
inline bool is_regular_file(const std::string& path) { return stat_path(path).is_file(); }
inline std::vector<DirEntry> list_directory(const std::string& dir) { return storage_for(dir).list(dir); }
inline std::string resolved_path(const std::string& path) { return storage_for(path).resolved(path); }
// An existing directory with nothing in it.
inline bool is_empty_directory(const std::string& dir) { return is_directory(dir) && list_directory(dir).empty(); }

// Where an s3:// output that a library writes by name (HDF5) is spooled
// before its upload: $TMPDIR, else /tmp. It needs the output's size free.
std::string spool_directory();

// Makes `dir` the directory relative paths start from (finalize reruns a
// --part request where its workers ran); false when it cannot.
bool enter_directory(const std::string& dir);

// The whole file, for small text files (`latest`, config.json, a manifest):
// NotFound when missing, InvalidArgument naming it and `max_bytes` when
// larger (a file named `latest` that is a 10 GB blob is not a tag).
std::string read_small_file(const std::string& path, uint64_t max_bytes);

}  // namespace ckpt
