#include "io/byte_source.h"

#include "io/mapped_inputs.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>

#include "core/checked.h"
#include "core/error.h"
#include "io/containment.h"
#include "io/local_files.h"

namespace ckpt {

void ByteSource::check_range(uint64_t pos, uint64_t n) const {
  if (!range_fits(pos, n, size()))
    fail_data_loss(describe() + ": read of " + std::to_string(n) + " bytes at offset " + std::to_string(pos) +
                   " is past the end (" + std::to_string(size()) + " bytes)");
}

std::vector<std::byte> ByteSource::read_vector(uint64_t pos, std::size_t n) const {
  check_range(pos, n);
  std::vector<std::byte> out(n);
  read(pos, out.data(), n);
  return out;
}

std::string ByteSource::read_string(uint64_t pos, std::size_t n) const {
  check_range(pos, n);
  std::string out(n, '\0');
  read(pos, out.data(), n);
  return out;
}

namespace {

// An open descriptor; closed when the pool and every lease let go of it.
class OpenFd {
 public:
  explicit OpenFd(int fd) : fd_(fd) {}
  ~OpenFd() { ::close(fd_); }
  OpenFd(const OpenFd&) = delete;
  OpenFd& operator=(const OpenFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

class FileDescriptor;

// Every file source's descriptor, least recently used first. Past
// open_file_limit() the oldest are let go (closed once no lease holds
// them) and reopened by path when read again, the reopened file checked
// to be the one first opened.
class DescriptorPool {
 public:
  static DescriptorPool& get() {
    static DescriptorPool pool;
    return pool;
  }
  std::mutex mutex;
  std::list<FileDescriptor*> open;  // holding a descriptor, least recently used first

  // `f` holds a descriptor now and is the most recently used; the oldest
  // others let go of theirs past the limit. Called with `mutex` held.
  void touch(FileDescriptor* f, std::list<FileDescriptor*>::iterator& at, bool listed);
};

class FileDescriptor {
 public:
  FileDescriptor(std::string path, std::shared_ptr<OpenFd> fd, const struct stat& st)
      : path_(std::move(path)), dev_(st.st_dev), ino_(st.st_ino), fd_(std::move(fd)) {
    DescriptorPool& pool = DescriptorPool::get();
    std::lock_guard lock(pool.mutex);
    pool.touch(this, at_, false);
  }
  ~FileDescriptor() {
    DescriptorPool& pool = DescriptorPool::get();
    std::lock_guard lock(pool.mutex);
    if (fd_) pool.open.erase(at_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  uint64_t device() const { return static_cast<uint64_t>(dev_); }
  uint64_t inode() const { return static_cast<uint64_t>(ino_); }

  // The descriptor, open until the lease is dropped.
  std::shared_ptr<const OpenFd> lease() {
    DescriptorPool& pool = DescriptorPool::get();
    std::lock_guard lock(pool.mutex);
    const bool listed = fd_ != nullptr;
    if (!fd_) fd_ = reopen();
    pool.touch(this, at_, listed);
    return fd_;
  }

 private:
  friend class DescriptorPool;

  std::shared_ptr<OpenFd> reopen() const {
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
      int err = errno;
      fail(err == EMFILE || err == ENFILE ? ErrorCode::kResourceExhausted : ErrorCode::kDataLoss,
           path_ + ": cannot open again: " + std::strerror(err));
    }
    auto held = std::make_shared<OpenFd>(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_)
      fail_data_loss(path_ + ": replaced by another file while it was being read");
    if (int flags = ::fcntl(fd, F_GETFL); flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return held;
  }

  std::string path_;
  dev_t dev_;
  ino_t ino_;
  std::shared_ptr<OpenFd> fd_;  // null while let go
  std::list<FileDescriptor*>::iterator at_;
};

void DescriptorPool::touch(FileDescriptor* f, std::list<FileDescriptor*>::iterator& at, bool listed) {
  if (listed)
    open.splice(open.end(), open, at);
  else
    at = open.insert(open.end(), f);
  const std::size_t limit = open_file_limit();
  while (open.size() > limit && open.front() != f) {
    FileDescriptor* oldest = open.front();
    open.pop_front();
    oldest->fd_.reset();  // closed now, or when its last lease ends
  }
}

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// Opened non-blocking so that a FIFO (or a device) named where a checkpoint
// file belongs cannot block the open itself, then refused after fstat
// before a single byte is read.
std::shared_ptr<FileDescriptor> open_readonly(const std::string& path, uint64_t* size) {
  // A name read from a checkpoint (a DCP storage path, an index's shard)
  // with a NUL byte names no file (Python: "embedded null byte"); as a C
  // string it would open the file named by the bytes before it.
  if (auto nul = path.find('\0'); nul != std::string::npos)
    fail(ErrorCode::kUnsafe, path.substr(0, nul) + "\\0" + path.substr(nul + 1).substr(0, 200) +
                                 ": a file name with a NUL byte names no file; refused");
  require_contained(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int err = errno;
    // Out of descriptors is this process's limit, not a fault of the input.
    fail(err == ENOENT                    ? ErrorCode::kNotFound
         : err == EMFILE || err == ENFILE ? ErrorCode::kResourceExhausted
                                          : ErrorCode::kDataLoss,
         path + ": cannot open: " + std::strerror(err));
  }
  auto held = std::make_shared<OpenFd>(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_data_loss(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    fail(ErrorCode::kUnimplemented, path + ": is " + std::string(file_type_name(st.st_mode)) +
                                        ", not a regular file; checkpoints are read only from regular files");
  }
  if (int flags = ::fcntl(fd, F_GETFL); flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  *size = static_cast<uint64_t>(st.st_size);
  return std::make_shared<FileDescriptor>(path, std::move(held), st);
}

// n bytes at `offset` of fd, retrying short reads and EINTR; DataLoss
// naming `what` when the file ends first or the read fails.
void pread_exact(int fd, uint64_t offset, void* buf, std::size_t n, const std::string& what) {
  auto* out = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail_data_loss(what + ": read failed at offset " + std::to_string(offset) +
                     (got < 0 ? std::string(": ") + std::strerror(errno) : ": file shrank"));
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<std::size_t>(got);
  }
}

class FileSource final : public ByteSource {
 public:
  FileSource(std::string path, std::shared_ptr<FileDescriptor> fd, uint64_t size)
      : path_(std::move(path)), fd_(std::move(fd)), size_(size) {}
  uint64_t size() const override { return size_; }
  std::string describe() const override { return path_; }
  std::optional<FileSpan> file_span(uint64_t pos) const override {
    auto held = fd_->lease();
    return FileSpan{held->get(), pos, held, fd_->device(), fd_->inode()};
  }

  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    auto held = fd_->lease();
    pread_exact(held->get(), pos, buf, n, path_);
  }

 private:
  std::string path_;
  std::shared_ptr<FileDescriptor> fd_;
  uint64_t size_;
};

class MappedSource final : public ByteSource {
 public:
  MappedSource(std::string path, std::shared_ptr<FileDescriptor> fd, const std::byte* base, uint64_t size)
      : path_(std::move(path)),
        fd_(std::move(fd)),
        base_(base),
        size_(size),
        slot_(register_mapped_input(base_, size_, path_)) {}  // a truncated file: io/mapped_inputs.h
  ~MappedSource() override {
    unregister_mapped_input(slot_);
    ::munmap(const_cast<std::byte*>(base_), size_);
  }
  uint64_t size() const override { return size_; }
  std::string describe() const override { return path_; }
  const std::byte* data() const override { return base_; }
  std::optional<FileSpan> file_span(uint64_t pos) const override {
    auto held = fd_->lease();
    return FileSpan{held->get(), pos, held, fd_->device(), fd_->inode()};
  }
  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    if (n) std::memcpy(buf, base_ + pos, n);
  }
  void release(uint64_t pos, uint64_t n) const override {
    // Only whole pages inside the range: neighbours may still be in use.
    static const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    if (pos > size_ || n > size_ - pos) return;
    uint64_t begin = (pos + kPage - 1) / kPage * kPage, end = (pos + n) / kPage * kPage;
    if (pos + n == size_) end = (size_ + kPage - 1) / kPage * kPage;  // the tail page belongs to no one else
    if (begin < end) ::madvise(const_cast<std::byte*>(base_) + begin, end - begin, MADV_DONTNEED);
  }

 private:
  std::string path_;
  std::shared_ptr<FileDescriptor> fd_;
  const std::byte* base_;
  uint64_t size_;
  int slot_;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(std::string bytes, std::string name) : bytes_(std::move(bytes)), name_(std::move(name)) {}
  uint64_t size() const override { return bytes_.size(); }
  std::string describe() const override { return name_; }
  const std::byte* data() const override { return reinterpret_cast<const std::byte*>(bytes_.data()); }
  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    if (n) std::memcpy(buf, bytes_.data() + pos, n);
  }

 private:
  std::string bytes_;
  std::string name_;
};

class SubSource final : public ByteSource {
 public:
  SubSource(SourcePtr parent, uint64_t offset, uint64_t length)
      : parent_(std::move(parent)), offset_(offset), length_(length) {}
  uint64_t size() const override { return length_; }
  std::string describe() const override {
    return parent_->describe() + "[" + std::to_string(offset_) + ":+" + std::to_string(length_) + "]";
  }
  const std::byte* data() const override {
    const std::byte* p = parent_->data();
    return p ? p + offset_ : nullptr;
  }
  std::optional<FileSpan> file_span(uint64_t pos) const override { return parent_->file_span(offset_ + pos); }
  void release(uint64_t pos, uint64_t n) const override {
    if (pos <= length_ && n <= length_ - pos) parent_->release(offset_ + pos, n);
  }
  void prefetch(uint64_t pos, uint64_t n) const override {
    if (pos <= length_ && n <= length_ - pos) parent_->prefetch(offset_ + pos, n);
  }
  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    parent_->read(offset_ + pos, buf, n);
  }

 private:
  SourcePtr parent_;
  uint64_t offset_;
  uint64_t length_;
};

}  // namespace

SourcePtr open_local_file(const std::string& path) {
  uint64_t size = 0;
  auto fd = open_readonly(path, &size);
  return std::make_shared<FileSource>(path, std::move(fd), size);
}

SourcePtr open_local_mapped(const std::string& path) {
  uint64_t size = 0;
  auto fd = open_readonly(path, &size);
  if (size == 0) return std::make_shared<FileSource>(path, std::move(fd), size);
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd->lease()->get(), 0);
  if (base == MAP_FAILED) return std::make_shared<FileSource>(path, std::move(fd), size);
  return std::make_shared<MappedSource>(path, std::move(fd), static_cast<const std::byte*>(base), size);
}

SourcePtr make_memory_source(std::string bytes, std::string name) {
  return std::make_shared<MemorySource>(std::move(bytes), std::move(name));
}

SourcePtr make_sub_source(SourcePtr parent, uint64_t offset, uint64_t length) {
  if (!range_fits(offset, length, parent->size()))
    fail_data_loss(parent->describe() + ": range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                   ") exceeds its " + std::to_string(parent->size()) + " bytes");
  return std::make_shared<SubSource>(std::move(parent), offset, length);
}

std::size_t open_file_limit() {
  static const std::size_t limit = [] {
    struct rlimit rl {};
    uint64_t soft = 1024;
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      soft = rl.rlim_cur;
    else if (rl.rlim_cur == RLIM_INFINITY)
      soft = 4096;
    return static_cast<std::size_t>(std::clamp<uint64_t>(soft / 4, 16, 1024));
  }();
  return limit;
}

void ByteSource::read_unmapped(uint64_t pos, void* buf, std::size_t n) const {
  check_range(pos, n);
  if (auto span = file_span(pos))
    pread_exact(span->fd, span->offset, buf, n, describe());
  else
    read(pos, buf, n);
}

}  // namespace ckpt
