#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/memory_budget.h"
#include "io/s3_client.h"
#include "io/s3_storage.h"
#include "io/s3_url.h"
#include "io/storage.h"

namespace ckpt {

namespace {

// Reads shorter than this go through the range cache below (pickles, zip
// headers, JSON: many small reads close together); longer ones are one
// ranged GET straight into the caller's buffer (tensor bytes).
constexpr uint64_t kBlockSize = 256 * 1024;
// The cache's bytes (8 MiB, 32 blocks): bounded however many objects are open.
constexpr std::size_t kCachedBlocks = 32;

uint64_t name_hash(const std::string& s) { return static_cast<uint64_t>(std::hash<std::string>{}(s)); }

// "2026-12-05T05:19:18.000Z" (ListObjectsV2's LastModified) in seconds
// since the epoch; HEAD's Last-Modified has the same one-second precision.
int64_t iso8601_seconds(const std::string& text) {
  std::tm tm{};
  if (!strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

[[noreturn]] void fail_response(const std::string& url, const S3Response& r, const char* doing) {
  const std::string code = r.error_code();
  if (code == "NoSuchBucket") fail(ErrorCode::kNotFound, url + ": the bucket does not exist (" + r.error_text() + ")");
  if (r.status == 404) fail(ErrorCode::kNotFound, url + ": no such object (" + r.error_text() + ")");
  if (r.status == 403 || r.status == 401)
    fail_data_loss(url + ": access denied while " + doing + " (" + r.error_text() +
                   "); check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE) and the bucket's policy");
  fail_data_loss(url + ": " + doing + " failed: " + r.error_text());
}

// One page after another of ListObjectsV2 under `prefix`; with `delimiter`
// the names one level down only. `limit` > 0 stops after that many keys.
struct Listing {
  struct Object {
    std::string key;
    EntryStat stat;    // size and time
    std::string etag;  // quoted, as If-Match wants it
  };
  std::vector<Object> objects;
  std::vector<std::string> prefixes;  // common prefixes, '/' included
};

Listing list_objects(const S3Url& where, const std::string& prefix, bool delimiter, int limit) {
  const S3Client& client = default_s3_client();
  const std::string url = s3_url_string(where);
  Listing out;
  std::string token;
  do {
    S3Request req;
    req.bucket = where.bucket;
    req.query = {{"list-type", "2"}, {"prefix", prefix}};
    if (delimiter) req.query.emplace_back("delimiter", "/");
    if (limit > 0) req.query.emplace_back("max-keys", std::to_string(limit));
    if (!token.empty()) req.query.emplace_back("continuation-token", token);
    S3Response r = client.send(req, url);
    if (r.status != 200) fail_response(url, r, "listing");
    std::size_t at = 0, end = 0;
    while (auto item = xml_element(r.body, "Contents", at, &end)) {
      at = end;
      EntryStat st;
      st.kind = EntryKind::kFile;
      st.size = std::strtoull(xml_element(*item, "Size").value_or("0").c_str(), nullptr, 10);
      st.mtime_ns = iso8601_seconds(xml_element(*item, "LastModified").value_or("")) * 1000000000;
      out.objects.push_back({xml_element(*item, "Key").value_or(""), st, xml_element(*item, "ETag").value_or("")});
    }
    at = 0;
    while (auto item = xml_element(r.body, "CommonPrefixes", at, &end)) {
      at = end;
      out.prefixes.push_back(xml_element(*item, "Prefix").value_or(""));
    }
    const bool truncated = xml_element(r.body, "IsTruncated").value_or("false") == "true";
    token = truncated ? xml_element(r.body, "NextContinuationToken").value_or("") : "";
    if (limit > 0) break;
  } while (!token.empty());
  return out;
}

// Process-wide LRU of byte ranges of objects, bounded by their bytes
// (kCacheBytes) however many objects are open: the kBlockSize blocks that
// small reads fetch and the ranges prefetch() fetched (a DCP file's item
// headers, one range per gap between two items' tensor bytes).
class RangeCache {
 public:
  static RangeCache& get() {
    static RangeCache* cache = new RangeCache;  // never destroyed: fetch threads may add to it at exit
    return *cache;
  }
  // A cached range of `object` holding [pos, pos + n), and where it begins; null when none.
  std::shared_ptr<const std::string> find(uint64_t object, uint64_t pos, uint64_t n, uint64_t* begin) {
    std::lock_guard lock(mutex_);
    for (auto it = ranges_.begin(); it != ranges_.end(); ++it)
      if (it->object == object && it->begin <= pos && pos + n <= it->begin + it->bytes->size()) {
        ranges_.splice(ranges_.begin(), ranges_, it);
        *begin = it->begin;
        return it->bytes;
      }
    return nullptr;
  }
  void add(uint64_t object, uint64_t begin, std::shared_ptr<const std::string> bytes) {
    std::lock_guard lock(mutex_);
    held_ += bytes->size();
    ranges_.push_front({object, begin, std::move(bytes)});
    while (held_ > kCacheBytes && ranges_.size() > 1) {
      held_ -= ranges_.back().bytes->size();
      ranges_.pop_back();
    }
  }

 private:
  static constexpr uint64_t kCacheBytes = kCachedBlocks * kBlockSize;
  struct Entry {
    uint64_t object, begin;
    std::shared_ptr<const std::string> bytes;
  };
  std::mutex mutex_;
  std::list<Entry> ranges_;
  uint64_t held_ = 0;
};

// The object a source reads, shared with the read-ahead fetches it starts.
struct ObjectRef {
  S3Url where;
  std::string url;
  uint64_t size;
  std::string etag;  // If-Match pins the version first seen
};

// Bytes [pos, pos + n) of the object into `into`: one ranged GET. An
// object replaced during the run fails the read instead of mixing versions.
void get_range(const ObjectRef& o, uint64_t pos, char* into, std::size_t n) {
  S3Request req;
  req.bucket = o.where.bucket;
  req.key = o.where.key;
  req.range = {{pos, pos + n - 1}};
  req.into = into;
  req.into_size = n;
  if (!o.etag.empty()) req.headers.push_back("If-Match: " + o.etag);
  S3Response r = default_s3_client().send(req, o.url);
  if (r.status == 412) fail_data_loss(o.url + ": the object was replaced while it was being read");
  if (r.status != 206 && r.status != 200) fail_response(o.url, r, "reading");
  if (r.status == 200 && n != o.size)  // a service ignoring Range sent the whole object
    fail_data_loss(o.url + ": the service ignored the byte range asked for");
}

// --- Read-ahead -------------------------------------------------------------
//
// A copy streams a tensor's bytes in steps of a few MiB, and a checkpoint's
// items follow one another in their file, so most bytes of an object are
// read front to back. Asked one step at a time, that is one GET per step,
// each waited for. An object read sequentially instead gets a stream: GETs
// of kReadAheadDepth chunks of chunk_size() bytes ahead of the reader, on
// the fetch threads, so the next chunk is on the wire while the reader
// copies the last. All streams of the process together hold at most the
// read-ahead budget (a quarter of --memory-limit, MemoryBudget::read_ahead);
// a stream that finds it spent reads directly, as without read-ahead.
// Nothing is fetched twice: a stream only moves forward, and bytes it
// skipped (a gap of headers between two items) are dropped unread.

std::atomic<uint64_t> g_read_ahead_budget{0};  // set by a job that reads an s3:// source
std::atomic<uint64_t> g_read_ahead_held{0};

constexpr uint64_t kMaxChunk = uint64_t{8} << 20;  // AWS's advice for ranged GETs: 8 to 16 MiB
constexpr uint64_t kMinChunk = uint64_t{1} << 20;
constexpr std::size_t kReadAheadDepth = 2;    // chunks per stream: one being read, one on the wire
constexpr std::size_t kStreamsPerObject = 4;  // validate's workers read parts of one object at once

// Default --memory-limit: 64 MiB of read-ahead, 8 MiB chunks, four streams
// of two chunks (a DCP checkpoint of world size 4 read rank file by rank
// file, side by side).
uint64_t chunk_size() {
  return std::clamp<uint64_t>(g_read_ahead_budget.load() / (kStreamsPerObject * kReadAheadDepth), kMinChunk, kMaxChunk);
}

// Chunks a stream of an object of `size` bytes holds ahead: kReadAheadDepth
// while that is at most an eighth of the object, else one. The read-ahead
// then scales with the checkpoint (at most an eighth of the objects being
// read, plus a chunk each) rather than taking the whole budget for a small
// one: a DCP checkpoint of 0.5 GB at world size 4 (objects of 125 MB) held
// 64 MiB of chunks, 13% of it, on top of the 28 MB a local run takes. The
// chunk keeps its size, so the GETs stay as many (and as large) as before;
// the streams of the objects read side by side still overlap each other.
std::size_t depth_for(uint64_t size) { return size / 8 >= kReadAheadDepth * chunk_size() ? kReadAheadDepth : 1; }

bool reserve_read_ahead(uint64_t n) {
  uint64_t held = g_read_ahead_held.load();
  do {
    if (held + n > g_read_ahead_budget.load()) return false;
  } while (!g_read_ahead_held.compare_exchange_weak(held, held + n));
  return true;
}

// Threads that run read-ahead GETs. Persistent, so that each keeps its
// libcurl handle and with it a keep-alive connection (a TLS handshake per
// chunk would cost more than the chunk on a real store). Never destroyed:
// a source waits for its fetches before it goes, so at exit they are idle.
class FetchThreads {
 public:
  static FetchThreads& get() {
    static FetchThreads* threads = new FetchThreads(static_cast<int>(kStreamsPerObject * kReadAheadDepth));
    return *threads;
  }
  std::shared_future<void> submit(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    std::shared_future<void> done = task.get_future().share();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    return done;
  }

 private:
  explicit FetchThreads(int n) {
    for (int i = 0; i < n; ++i) std::thread([this] { run(); }).detach();
  }
  void run() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return !queue_.empty(); });
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // an exception lands in the future, for the reader to rethrow
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> queue_;
};

// One run of front-to-back reads of an object and the chunks fetched ahead of it.
class ReadStream {
 public:
  explicit ReadStream(uint64_t end) : end_(end) {}
  ReadStream(const ReadStream&) = delete;
  ReadStream& operator=(const ReadStream&) = delete;
  ~ReadStream() { drop_all(); }

  std::mutex mutex;  // held by the read it serves

  // Whether a read at `pos` continues this stream: inside what it fetched,
  // or at most a chunk past where the last read ended (the headers between
  // two items of a file).
  // Read without the stream's lock (atomics) to pick a stream; the read
  // asks again under the lock.
  bool continues_at(uint64_t pos) const {
    if (pos >= window_begin_ && pos < fetched_end_) return true;
    const uint64_t end = end_;
    return pos >= end && pos - end <= chunk_size();
  }

  // Serves [pos, pos + n) from the chunks, fetching ahead as it goes;
  // false (nothing copied) when there is no budget for a first chunk, and
  // the caller reads directly.
  bool serve(const std::shared_ptr<const ObjectRef>& object, uint64_t pos, char* out, std::size_t n) {
    while (!chunks_.empty() && (pos < chunks_.front().pos || chunks_.front().end() <= pos)) drop_front();
    if (chunks_.empty()) fetched_end_ = pos;
    top_up(object);
    if (chunks_.empty()) {
      end_ = pos + n;
      window_begin_ = fetched_end_.load();
      return false;
    }
    while (n > 0) {
      if (chunks_.empty()) {  // the budget ran out under this read: the rest directly
        get_range(*object, pos, out, n);
        pos += n;
        break;
      }
      Chunk& c = chunks_.front();
      c.done.get();  // rethrows the fetch's error
      const std::size_t take = static_cast<std::size_t>(std::min<uint64_t>(n, c.end() - pos));
      std::memcpy(out, c.bytes.get() + (pos - c.pos), take);
      out += take;
      pos += take;
      n -= take;
      if (pos == c.end()) {
        drop_front();
        top_up(object);
      }
    }
    end_ = pos;
    window_begin_ = chunks_.empty() ? fetched_end_.load() : chunks_.front().pos;
    return true;
  }

  // Drops the chunks at the front that lie inside [pos, pos + n), which the
  // reader says it will not read again: another reader read them (two
  // threads gathering halves of a slab, one stream overtaking the other),
  // and kept they would hold the budget for good.
  void release(uint64_t pos, uint64_t n) {
    while (!chunks_.empty() && chunks_.front().pos >= pos && chunks_.front().end() <= pos + n) drop_front();
    window_begin_ = chunks_.empty() ? fetched_end_.load() : chunks_.front().pos;
  }

 private:
  struct Chunk {
    uint64_t pos, size;
    std::shared_ptr<char[]> bytes;
    std::shared_future<void> done;
    uint64_t end() const { return pos + size; }
  };

  void top_up(const std::shared_ptr<const ObjectRef>& object) {
    while (chunks_.size() < depth_for(object->size) && fetched_end_ < object->size) {
      const uint64_t size = std::min(chunk_size(), object->size - fetched_end_.load());
      if (!reserve_read_ahead(size)) return;
      Chunk c{fetched_end_, size, std::shared_ptr<char[]>(new char[size]), {}};
      c.done = FetchThreads::get().submit(
          [object, pos = c.pos, size, bytes = c.bytes] { get_range(*object, pos, bytes.get(), size); });
      fetched_end_ += size;
      chunks_.push_back(std::move(c));
    }
  }
  // A chunk in flight is waited for (it writes into its buffer) and its
  // error, if any, dropped with it: nobody reads those bytes.
  void drop_front() {
    chunks_.front().done.wait();
    g_read_ahead_held -= chunks_.front().size;
    chunks_.pop_front();
  }
  void drop_all() {
    while (!chunks_.empty()) drop_front();
  }

  // Where the last read ended, and the window [window_begin_, fetched_end_)
  // of bytes fetched or on the wire.
  std::atomic<uint64_t> end_;
  std::atomic<uint64_t> window_begin_{0};
  std::atomic<uint64_t> fetched_end_{0};
  std::deque<Chunk> chunks_;
};

// Ranges of one object on the wire for prefetch(), by where they begin, so
// that a read inside one waits for it instead of asking again. Shared with
// the fetches.
struct PendingRanges {
  struct Fetch {
    std::shared_ptr<std::string> bytes;
    std::shared_future<void> done;
  };
  std::mutex mutex;
  std::map<uint64_t, Fetch> ranges;
  // The range on the wire holding [pos, pos + n), if any (the lock held).
  const std::pair<const uint64_t, Fetch>* holding(uint64_t pos, uint64_t n) const {
    auto it = ranges.upper_bound(pos);
    if (it == ranges.begin()) return nullptr;
    --it;
    return pos + n <= it->first + it->second.bytes->size() ? &*it : nullptr;
  }
};

// Prefetched ranges on the wire, all objects together: a hint beyond this is
// dropped (the fetch threads are busy; the read will ask itself). With
// kMaxPrefetchRange, they hold 8 MiB at most.
constexpr int kMaxPrefetches = 8;
constexpr uint64_t kMaxPrefetchRange = uint64_t{1} << 20;
std::atomic<int> g_prefetches{0};

// An object read by ranged GETs: small reads through the range cache, large
// ones straight into the caller's buffer, sequential ones from a ReadStream.
class S3ObjectSource final : public ByteSource {
 public:
  S3ObjectSource(S3Url where, uint64_t size, std::string etag) {
    std::string url = s3_url_string(where);
    object_ = std::make_shared<const ObjectRef>(ObjectRef{std::move(where), std::move(url), size, std::move(etag)});
    static std::atomic<uint64_t> next{1};
    id_ = next++;
  }
  uint64_t size() const override { return object_->size; }
  std::string describe() const override { return object_->url; }

  void release(uint64_t pos, uint64_t n) const override {
    std::vector<std::shared_ptr<ReadStream>> streams;
    {
      std::lock_guard lock(mutex_);
      streams = streams_;
    }
    for (const auto& stream : streams) {
      std::unique_lock lock(stream->mutex, std::try_to_lock);  // one being read is in use: left alone
      if (lock.owns_lock()) stream->release(pos, n);
    }
  }

  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    if (n == 0) return;
    auto* out = static_cast<char*>(buf);
    uint64_t begin = 0;
    if (auto held = RangeCache::get().find(id_, pos, n, &begin)) {
      std::memcpy(out, held->data() + (pos - begin), n);
      return;
    }
    if (read_ahead(pos, out, n)) return;
    if (n >= kBlockSize) return get_range(*object_, pos, out, n);
    // Piece by piece from what holds each byte: a cached or prefetched
    // range, else the byte's block, fetched and cached.
    while (n > 0) {
      std::shared_ptr<const std::string> bytes = RangeCache::get().find(id_, pos, 1, &begin);
      if (!bytes) bytes = prefetched(pos, &begin);
      if (!bytes) {
        begin = pos / kBlockSize * kBlockSize;
        auto fetched = std::make_shared<std::string>(std::min(kBlockSize, size() - begin), '\0');
        get_range(*object_, begin, fetched->data(), fetched->size());
        RangeCache::get().add(id_, begin, fetched);
        bytes = fetched;
      }
      const std::size_t take = static_cast<std::size_t>(std::min<uint64_t>(n, begin + bytes->size() - pos));
      std::memcpy(out, bytes->data() + (pos - begin), take);
      out += take;
      pos += take;
      n -= take;
    }
  }

 private:
  // True when a stream served the read. A read that continues a stream is
  // served by it; a large read that does not starts a stream (the least
  // recently used one gives way) that fetches ahead from its next read on,
  // so an object read once at random fetches nothing it was not asked for.
  bool read_ahead(uint64_t pos, char* out, std::size_t n) const {
    std::shared_ptr<ReadStream> stream;
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < streams_.size() && !stream; ++i) {
        if (!streams_[i]->continues_at(pos)) continue;
        std::rotate(streams_.begin(), streams_.begin() + static_cast<std::ptrdiff_t>(i),
                    streams_.begin() + static_cast<std::ptrdiff_t>(i) + 1);  // most recent first
        stream = streams_.front();
      }
      if (!stream) {
        if (n < kBlockSize) return false;  // headers and pickles: the range cache
        if (streams_.size() == kStreamsPerObject) streams_.pop_back();
        streams_.insert(streams_.begin(), std::make_shared<ReadStream>(pos + n));
        return false;
      }
    }
    // Another reader may have moved the stream since: then read directly.
    std::lock_guard lock(stream->mutex);
    return stream->continues_at(pos) && stream->serve(object_, pos, out, n);
  }

  // Fetches [pos, pos + n) into the range cache in the background, in one
  // GET (at most kMaxPrefetchRange of it; kMaxPrefetches on the wire,
  // process-wide), unless a cached or pending range holds it already.
 public:
  void prefetch(uint64_t pos, uint64_t n) const override {
    if (n == 0 || pos >= size()) return;
    n = std::min({n, size() - pos, kMaxPrefetchRange});
    uint64_t begin = 0;
    if (RangeCache::get().find(id_, pos, n, &begin)) return;
    std::lock_guard lock(pending_->mutex);
    if (pending_->holding(pos, n) || pending_->ranges.count(pos)) return;
    if (++g_prefetches > kMaxPrefetches) {
      --g_prefetches;
      return;
    }
    auto bytes = std::make_shared<std::string>(n, '\0');
    auto done = FetchThreads::get().submit([object = object_, pending = pending_, id = id_, pos, bytes] {
      struct Finish {  // whatever the fetch did: the slot is free, the range no longer pending
        std::shared_ptr<PendingRanges> pending;
        uint64_t pos;
        ~Finish() {
          --g_prefetches;
          std::lock_guard lock(pending->mutex);
          pending->ranges.erase(pos);
        }
      } finish{pending, pos};
      get_range(*object, pos, bytes->data(), bytes->size());
      RangeCache::get().add(id, pos, bytes);
    });
    pending_->ranges[pos] = {bytes, done};
  }

 private:
  // The prefetched range on the wire holding byte `pos`, once it arrived
  // (its error rethrown), and where it begins; null when none is pending.
  std::shared_ptr<const std::string> prefetched(uint64_t pos, uint64_t* begin) const {
    PendingRanges::Fetch fetch;
    {
      std::lock_guard lock(pending_->mutex);
      auto* it = pending_->holding(pos, 1);
      if (!it) return nullptr;
      *begin = it->first;
      fetch = it->second;
    }
    fetch.done.get();
    return fetch.bytes;
  }

  std::shared_ptr<const ObjectRef> object_;
  std::shared_ptr<PendingRanges> pending_ = std::make_shared<PendingRanges>();
  uint64_t id_;
  mutable std::mutex mutex_;  // guards the list; each stream has its own lock for its reads
  mutable std::vector<std::shared_ptr<ReadStream>> streams_;
};

class S3Storage final : public Storage {
 public:
  // Service failures (unreachable, access denied, a missing bucket) throw a
  // clear error instead of answering kNone: "no such checkpoint" would hide
  // why. A key that is not there is kNone, as for a local path.
  EntryStat stat(const std::string& path) const override {
    const S3Url where = parse_s3_url(path);
    const std::string url = s3_url_string(where);
    if (auto known = remembered(url)) return *known;
    EntryStat st;
    if (where.key.empty()) {
      list_objects(where, "", false, 1);  // throws for a missing bucket
      st.kind = EntryKind::kDirectory;
      return remember(url, st);
    }
    S3Request head;
    head.method = "HEAD";
    head.bucket = where.bucket;
    head.key = where.key;
    S3Response r = default_s3_client().send(head, url);
    if (r.status == 200) {
      st.kind = EntryKind::kFile;
      st.size = std::strtoull(r.headers["content-length"].c_str(), nullptr, 10);
      st.mtime_ns = std::max<int64_t>(r.last_modified_s, 0) * 1000000000;
      std::lock_guard lock(mutex_);
      etags_[url] = r.headers["etag"];
    } else if (r.status != 404) {
      fail_response(url, r, "looking up");
    }
    if (!st.resolves()) {
      Listing below = list_objects(where, where.key + "/", false, 1);  // throws for a missing bucket
      if (!below.objects.empty()) st.kind = EntryKind::kDirectory;
    }
    return remember(url, identified(url, where, st));
  }

  std::vector<DirEntry> list(const std::string& dir) const override {
    const S3Url where = parse_s3_url(dir);
    const std::string url = s3_url_string(where);
    {
      std::lock_guard lock(mutex_);
      if (auto it = listings_.find(url); it != listings_.end()) return it->second;
    }
    const std::string prefix = where.key.empty() ? "" : where.key + "/";
    Listing l = list_objects(where, prefix, true, 0);
    std::vector<DirEntry> out;
    for (auto& [key, st, etag] : l.objects) {
      if (key.size() <= prefix.size()) continue;  // the "folder" marker object PREFIX/ itself
      DirEntry e{key.substr(prefix.size()), url + "/" + key.substr(prefix.size()), EntryKind::kFile, false};
      remember(e.path, identified(e.path, parse_s3_url(e.path), st));
      {
        std::lock_guard lock(mutex_);
        etags_.emplace(e.path, etag);
      }
      out.push_back(std::move(e));
    }
    for (const auto& p : l.prefixes) {
      std::string name = p.substr(prefix.size());
      while (!name.empty() && name.back() == '/') name.pop_back();
      if (name.empty()) continue;
      DirEntry e{name, url + "/" + name, EntryKind::kDirectory, false};
      EntryStat st;
      st.kind = EntryKind::kDirectory;
      remember(e.path, identified(e.path, parse_s3_url(e.path), st));
      out.push_back(std::move(e));
    }
    std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    std::lock_guard lock(mutex_);
    return listings_[url] = out;
  }

  SourcePtr open(const std::string& path, bool mapped) const override {
    (void)mapped;  // never mapped: callers read through read() when data() is null
    const EntryStat st = stat(path);
    const S3Url where = parse_s3_url(path);
    const std::string url = s3_url_string(where);
    if (!st.resolves()) fail(ErrorCode::kNotFound, url + ": no such object");
    if (!st.is_file()) fail(ErrorCode::kUnimplemented, url + ": is a prefix (a folder of objects), not an object");
    std::string etag;
    {
      std::lock_guard lock(mutex_);
      if (auto it = etags_.find(url); it != etags_.end()) etag = it->second;
    }
    return std::make_shared<S3ObjectSource>(where, st.size, etag);
  }

  std::optional<std::string> local_path(const std::string& path) const override {
    (void)path;
    return std::nullopt;
  }

  std::string resolved(const std::string& path) const override { return s3_url_string(parse_s3_url(path)); }

  // Outputs are uploaded by the output driver (exec/parted_output.h,
  // io/s3_upload.h), not staged in folders and renamed: these local-output
  // steps have no meaning on a bucket, and say so if a job ever asks.
  bool make_directory(const std::string& dir) const override { refuse_output(dir); }
  bool remove(const std::string& path) const override {
    (void)path;
    return false;
  }
  void remove_tree(const std::string& path) const override { (void)path; }
  void link_or_copy(const std::string& from, const std::string& to) const override {
    (void)from;
    refuse_output(to);
  }
  void copy_link(const std::string& from, const std::string& to) const override {
    (void)from;
    refuse_output(to);
  }

 private:
  [[noreturn]] static void refuse_output(const std::string& path) {
    fail(ErrorCode::kOutputFailed, path + ": writing to s3:// is not supported yet (docs/object-storage.md)");
  }

  static EntryStat identified(const std::string& url, const S3Url& where, EntryStat st) {
    st.device = name_hash(where.bucket);  // identity: one key is one file
    st.inode = name_hash(url);
    return st;
  }

  std::optional<EntryStat> remembered(const std::string& url) const {
    std::lock_guard lock(mutex_);
    auto it = stats_.find(url);
    return it == stats_.end() ? std::nullopt : std::optional<EntryStat>(it->second);
  }
  // The first look wins, so a file's time and size stay the same all run.
  EntryStat remember(const std::string& url, const EntryStat& st) const {
    std::lock_guard lock(mutex_);
    return stats_.emplace(url, st).first->second;
  }

  mutable std::mutex mutex_;
  mutable std::map<std::string, EntryStat> stats_;
  mutable std::map<std::string, std::vector<DirEntry>> listings_;
  mutable std::map<std::string, std::string> etags_;
};

}  // namespace

const Storage& s3_storage() {
  static const S3Storage storage;
  return storage;
}

void set_s3_read_ahead_budget(uint64_t bytes) { g_read_ahead_budget = bytes; }

std::vector<std::string> s3_objects_below(const std::string& dir) {
  const S3Url where = parse_s3_url(dir);
  std::vector<std::string> out;
  for (const auto& o : list_objects(where, where.key.empty() ? "" : where.key + "/", false, 0).objects)
    out.push_back(s3_url_string({where.bucket, o.key}));
  return out;
}

}  // namespace ckpt
