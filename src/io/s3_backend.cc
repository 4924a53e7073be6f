#include <algorithm>
#include <atomic>
#include <cstring>
#include <ctime>
#include <list>
#include <map>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "io/s3_client.h"
#include "io/s3_storage.h"
#include "io/s3_url.h"
#include "io/storage.h"

namespace ckpt {

namespace {

// Reads shorter than this go through the block cache below (pickles, zip
// headers, JSON: many small reads close together); longer ones are one
// ranged GET straight into the caller's buffer (tensor bytes).
constexpr uint64_t kBlockSize = 256 * 1024;
// Blocks the whole process keeps (8 MiB): bounded however many objects are open.
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

// Process-wide LRU of kBlockSize blocks, keyed by (object, block index).
class BlockCache {
 public:
  static BlockCache& get() {
    static BlockCache cache;
    return cache;
  }
  std::shared_ptr<const std::string> find(uint64_t object, uint64_t block) {
    std::lock_guard lock(mutex_);
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
      if (it->object == object && it->block == block) {
        blocks_.splice(blocks_.begin(), blocks_, it);
        return it->bytes;
      }
    return nullptr;
  }
  void add(uint64_t object, uint64_t block, std::shared_ptr<const std::string> bytes) {
    std::lock_guard lock(mutex_);
    blocks_.push_front({object, block, std::move(bytes)});
    if (blocks_.size() > kCachedBlocks) blocks_.pop_back();
  }

 private:
  struct Entry {
    uint64_t object, block;
    std::shared_ptr<const std::string> bytes;
  };
  std::mutex mutex_;
  std::list<Entry> blocks_;
};

// An object read by ranged GETs. If-Match pins the version first seen: an
// object replaced during the run fails the read instead of mixing versions.
class S3ObjectSource final : public ByteSource {
 public:
  S3ObjectSource(S3Url where, uint64_t size, std::string etag)
      : where_(std::move(where)), url_(s3_url_string(where_)), size_(size), etag_(std::move(etag)) {
    static std::atomic<uint64_t> next{1};
    id_ = next++;
  }
  uint64_t size() const override { return size_; }
  std::string describe() const override { return url_; }

  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    if (n == 0) return;
    if (n >= kBlockSize) return get(pos, static_cast<char*>(buf), n);
    auto* out = static_cast<char*>(buf);
    while (n > 0) {
      const uint64_t block = pos / kBlockSize, within = pos % kBlockSize;
      auto bytes = BlockCache::get().find(id_, block);
      if (!bytes) {
        auto fetched = std::make_shared<std::string>(std::min(kBlockSize, size_ - block * kBlockSize), '\0');
        get(block * kBlockSize, fetched->data(), fetched->size());
        BlockCache::get().add(id_, block, fetched);
        bytes = fetched;
      }
      const std::size_t take = static_cast<std::size_t>(std::min<uint64_t>(n, bytes->size() - within));
      std::memcpy(out, bytes->data() + within, take);
      out += take;
      pos += take;
      n -= take;
    }
  }

 private:
  void get(uint64_t pos, char* into, std::size_t n) const {
    S3Request req;
    req.bucket = where_.bucket;
    req.key = where_.key;
    req.range = {{pos, pos + n - 1}};
    req.into = into;
    req.into_size = n;
    if (!etag_.empty()) req.headers.push_back("If-Match: " + etag_);
    S3Response r = default_s3_client().send(req, url_);
    if (r.status == 412) fail_data_loss(url_ + ": the object was replaced while it was being read");
    if (r.status != 206 && r.status != 200) fail_response(url_, r, "reading");
    if (r.status == 200 && n != size_)  // a service ignoring Range sent the whole object
      fail_data_loss(url_ + ": the service ignored the byte range asked for");
  }

  S3Url where_;
  std::string url_;
  uint64_t size_;
  std::string etag_;
  uint64_t id_;
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

std::vector<std::string> s3_objects_below(const std::string& dir) {
  const S3Url where = parse_s3_url(dir);
  std::vector<std::string> out;
  for (const auto& o : list_objects(where, where.key.empty() ? "" : where.key + "/", false, 0).objects)
    out.push_back(s3_url_string({where.bucket, o.key}));
  return out;
}

}  // namespace ckpt
