#include "check/file_streams.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/interrupt.h"
#include "io/storage.h"

namespace ckpt::check {
namespace {

constexpr std::size_t kSlice = std::size_t{256} << 10;
// Bytes no scan reads that a feed reads itself to catch a stream up: the
// zip headers and pickles between two records are a few KiB.
constexpr uint64_t kMaxGap = uint64_t{4} << 20;

// The Reading this thread announced last (a scan reads one range at a
// time): its own range is not waited for.
thread_local uint64_t current_reading = 0;

}  // namespace

// Records up to this size are held when they arrive early, larger ones wait.
constexpr uint64_t kSmallRecord = uint64_t{1} << 20;
// Longest a feed waits for another worker's bytes before holding its slice.
constexpr auto kMaxWait = std::chrono::seconds(1);

struct FileStreams::Stream {
  std::string path;
  std::size_t index = 0;  // in `files`
  uint64_t size = 0;
  std::mutex mutex;
  std::unique_ptr<Hasher> hasher;
  uint64_t position = 0;                                      // bytes hashed so far
  std::map<uint64_t, std::vector<std::byte>> early;           // slices that arrived ahead of position
  std::vector<std::pair<uint64_t, uint64_t>> scanned;         // records the scan reads: sorted, disjoint
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> reading;  // id -> [begin, end) being read by a scan
  std::condition_variable moved;                              // position advanced or a reading ended
  SourcePtr file;                                             // for the bytes no scan reads
  std::string error;                                          // a direct read failed
  std::string checksum;
  bool done = false;
};

FileStreams::FileStreams(const std::vector<std::string>& files, ChecksumAlgorithm algorithm,
                         const CheckpointModel& model, uint64_t budget)
    : budget_(budget) {
  for (const auto& f : files) {
    auto s = std::make_unique<Stream>();
    s->path = f;
    s->index = streams_.size();
    s->hasher = std::make_unique<Hasher>(algorithm);
    if (EntryStat st = stat_path(f); st.is_file()) {
      s->size = st.size;
      by_inode_[{st.device, st.inode}] = s.get();
    } else {
      s->error = st.resolves() ? "cannot open: not a regular file" : "cannot open: No such file or directory";
    }
    streams_.push_back(std::move(s));
  }
  // Where the records the scan will read lie: gaps between them are what a
  // stream reads itself.
  std::set<const ByteSource*> seen;
  for (const auto& t : model.tensors)
    for (const auto& c : t.chunks) {
      if (!c.storage || !seen.insert(c.storage.get()).second) continue;
      auto span = c.storage->file_span(0);
      if (!span) continue;
      if (Stream* s = stream_of(*span)) s->scanned.emplace_back(span->offset, span->offset + c.storage->size());
    }
  for (auto& s : streams_) {
    auto& r = s->scanned;
    std::sort(r.begin(), r.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;
    for (const auto& range : r) {
      if (!merged.empty() && range.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, range.second);
      else
        merged.push_back(range);
    }
    r = std::move(merged);
  }
}

FileStreams::~FileStreams() = default;

FileStreams::Stream* FileStreams::stream_of(const FileSpan& at) {
  auto it = by_inode_.find({at.device, at.inode});
  return it == by_inode_.end() ? nullptr : it->second;
}

FileStreams::Reading::Reading(FileStreams& streams, const FileSpan& at, uint64_t n) {
  const uint64_t offset = at.offset;
  stream_ = streams.stream_of(at);
  if (!stream_) return;
  id_ = streams.next_reading_.fetch_add(1);
  std::lock_guard<std::mutex> lock(stream_->mutex);
  stream_->reading[id_] = {offset, offset + n};
  current_reading = id_;
}

FileStreams::Reading::~Reading() {
  if (!stream_) return;
  {
    std::lock_guard<std::mutex> lock(stream_->mutex);
    stream_->reading.erase(id_);
  }
  current_reading = 0;
  stream_->moved.notify_all();
}

bool FileStreams::others_reading_before(const Stream& s, uint64_t offset) const {
  for (const auto& [id, range] : s.reading)
    if (id != current_reading && range.first < offset && range.second > s.position) return true;
  return false;
}

void FileStreams::feed(const FileSpan& at, const std::byte* data, std::size_t n) noexcept {
  try {
    const uint64_t offset = at.offset;
    Stream* s = stream_of(at);
    if (!s) return;
    std::unique_lock<std::mutex> lock(s->mutex);
    // Another worker is reading bytes before these: wait for it to feed
    // them (bounded), rather than holding or dropping this slice.
    auto deadline = std::chrono::steady_clock::now() + kMaxWait;
    // A small record (a bias, an optimizer step) is held instead: waiting
    // for a large one before it would leave this worker idle.
    auto mine = s->reading.find(current_reading);
    bool large = mine != s->reading.end() && mine->second.second - mine->second.first > kSmallRecord;
    while (large && offset > s->position && !s->done && s->error.empty() && others_reading_before(*s, offset))
      if (s->moved.wait_until(lock, deadline) == std::cv_status::timeout) break;
    if (s->done || !s->error.empty()) return;
    uint64_t before = s->position;
    advance(*s, offset, data, n);
    if (s->position != before) s->moved.notify_all();
  } catch (...) {  // bad_alloc holding a slice: finish() reads those bytes
  }
}

void FileStreams::advance(Stream& s, uint64_t offset, const std::byte* data, std::size_t n) {
  if (offset + n <= s.position) return;  // hashed already
  if (offset > s.position && !read_gap(s, offset, false)) {
    {
      std::lock_guard<std::mutex> lock(budget_mutex_);
      if (held_ + n > budget_) return;  // dropped: finish() reads it
      held_ += n;
    }
    auto& slot = s.early[offset];
    uint64_t release = std::min<uint64_t>(slot.size(), n);
    if (slot.size() < n) slot.assign(data, data + n);
    std::lock_guard<std::mutex> lock(budget_mutex_);
    held_ -= release;
    return;
  }
  std::size_t skip = static_cast<std::size_t>(s.position - offset);
  s.hasher->update(data + skip, n - skip);
  s.position = offset + n;
  drain(s);
}

void FileStreams::drain(Stream& s) {
  while (!s.early.empty()) {
    auto it = s.early.begin();
    uint64_t begin = it->first, end = begin + it->second.size();
    if (begin > s.position && !read_gap(s, begin, false)) return;
    if (end > s.position) {
      std::size_t skip = static_cast<std::size_t>(s.position - begin);
      s.hasher->update(it->second.data() + skip, it->second.size() - skip);
      s.position = end;
    }
    {
      std::lock_guard<std::mutex> lock(budget_mutex_);
      held_ -= it->second.size();
    }
    s.early.erase(it);
  }
}

// Reads and hashes [position, to) itself: always when `anything`, else only
// a short gap no scan will read.
bool FileStreams::read_gap(Stream& s, uint64_t to, bool anything) {
  if (!anything) {
    if (to - s.position > kMaxGap) return false;
    // The first record ending after position: if it starts before `to`, a
    // scan will deliver those bytes.
    auto it = std::upper_bound(s.scanned.begin(), s.scanned.end(), s.position,
                               [](uint64_t at, const std::pair<uint64_t, uint64_t>& r) { return at < r.second; });
    if (it != s.scanned.end() && it->first < to) return false;
  }
  try {
    if (!s.file) s.file = open_file_source(s.path);
  } catch (const Error& e) {
    s.error = e.what();
    return false;
  }
  std::vector<std::byte> buf(static_cast<std::size_t>(std::min<uint64_t>(to - s.position, kSlice)));
  while (s.position < to) {
    if (s.position >= s.file->size()) {
      s.error = "the file ended at byte " + std::to_string(s.position) + " of " + std::to_string(s.size);
      return false;
    }
    auto step =
        static_cast<std::size_t>(std::min<uint64_t>({to - s.position, buf.size(), s.file->size() - s.position}));
    try {
      s.file->read_unmapped(s.position, buf.data(), step);
    } catch (const Error& e) {
      s.error = std::string("read failed: ") + e.what();
      return false;
    }
    s.hasher->update(buf.data(), step);
    s.position += step;
  }
  return true;
}

void FileStreams::complete(Stream& s) {
  drain(s);
  while (s.error.empty() && s.position < s.size) {
    uint64_t next = s.early.empty() ? s.size : std::min(s.size, std::max(s.early.begin()->first, s.position));
    if (next > s.position && !read_gap(s, next, true)) break;
    drain(s);
  }
  for (auto& [offset, slice] : s.early) {
    std::lock_guard<std::mutex> lock(budget_mutex_);
    held_ -= slice.size();
  }
  s.early.clear();
  s.done = true;
  if (!s.error.empty()) fail_data_loss(s.error);
  s.checksum = s.hasher->hex_digest();
}

void FileStreams::finish(ProblemSink& problems) {
  for (std::size_t k; (k = next_to_finish_.fetch_add(1)) < streams_.size();) {
    check_interrupted();
    Stream& s = *streams_[k];
    run_reporting(&problems, s.path, -1, "", [&] {
      std::lock_guard<std::mutex> lock(s.mutex);
      complete(s);
    });
  }
}

std::optional<std::size_t> FileStreams::file_of(const TensorChunk& chunk) const {
  if (chunk.storage)
    if (auto span = chunk.storage->file_span(0)) {
      auto it = by_inode_.find({span->device, span->inode});
      if (it != by_inode_.end()) return it->second->index;
      return std::nullopt;
    }
  for (const auto& s : streams_)
    if (s->path == chunk.file) return s->index;
  return std::nullopt;
}

const std::string& FileStreams::checksum(std::size_t k) const { return streams_.at(k)->checksum; }
uint64_t FileStreams::size(std::size_t k) const { return streams_.at(k)->size; }

}  // namespace ckpt::check
