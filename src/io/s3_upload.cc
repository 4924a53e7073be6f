#include "io/s3_upload.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "core/log.h"
#include "io/s3_client.h"

namespace ckpt {

namespace {

// Sends a request of an output. A service that never answered is a write
// that failed (exit 4), not an unreadable input as for reads; 412 is an
// object that appeared at the name meanwhile.
// `judge_lost_answers`: 412 and 404 are returned, for the caller to tell
// apart from a try whose success was lost.
S3Response send_write(const S3Request& req, const std::string& url, const char* doing,
                      bool judge_lost_answers = false) {
  S3Response r;
  try {
    r = default_s3_client().send(req, url);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kDataLoss) throw;
    fail(ErrorCode::kOutputFailed, e.message());
  }
  if (judge_lost_answers && (r.status == 412 || r.status == 404)) return r;
  if (r.status == 412) fail_invalid(url + ": output exists (use --force to overwrite)");
  // CompleteMultipartUpload may answer 200 and still fail, in its body.
  const bool error_body = r.body.find("<Error>") != std::string::npos;
  if (r.status < 200 || r.status >= 300 || error_body) {
    if (r.status == 403 || r.status == 401)
      fail(ErrorCode::kOutputFailed, url + ": access denied while " + doing + " (" + r.error_text() +
                                         "); check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE) and the "
                                         "bucket's policy");
    fail(ErrorCode::kOutputFailed, url + ": " + doing + " failed: " + r.error_text());
  }
  return r;
}

// The ETag S3 gives an object completed from parts with these ETags (each
// the quoted MD5 of its part): the MD5 of the parts' MD5s, "-", their
// count. Empty when a part's ETag is no MD5 (encryption with KMS keys).
std::string multipart_etag(const std::vector<std::string>& parts) {
  std::string digests;
  for (const auto& quoted : parts) {
    std::string hex = quoted;
    hex.erase(std::remove(hex.begin(), hex.end(), '"'), hex.end());
    if (hex.size() != 32) return "";
    for (std::size_t i = 0; i < 32; i += 2) {
      char* end = nullptr;
      const std::string byte = hex.substr(i, 2);
      const long v = std::strtol(byte.c_str(), &end, 16);
      if (end != byte.c_str() + 2) return "";
      digests += static_cast<char>(v);
    }
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(digests.data(), digests.size(), md, &len, EVP_md5(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out + "-" + std::to_string(parts.size()) + "\"";
}

S3Request request_for(const S3Url& where, const char* method) {
  S3Request req;
  req.method = method;
  req.bucket = where.bucket;
  req.key = where.key;
  return req;
}

// The object at `where` is the one a completion of parts with these ETags
// makes (its ETag is their multipart_etag).
bool completed_from(const S3Url& where, const std::vector<std::string>& etags) {
  const std::string expected = multipart_etag(etags);
  if (expected.empty()) return false;
  S3Request head = request_for(where, "HEAD");
  S3Response r = default_s3_client().send(head, s3_url_string(where));
  return r.status == 200 && r.headers["etag"] == expected;
}

}  // namespace

uint64_t s3_part_size(uint64_t size) {
  const uint64_t mib = 1u << 20;
  const uint64_t needed = (size + kS3MaxParts - 1) / kS3MaxParts;
  return std::max(kS3MinPartSize, (needed + mib - 1) / mib * mib);
}

unsigned s3_parts_on_the_wire(uint64_t budget, uint64_t part_size) {
  const uint64_t buffers = part_size ? budget / part_size : 0;
  return static_cast<unsigned>(std::min<uint64_t>(buffers > 0 ? buffers - 1 : 0, kS3MaxPartsOnTheWire));
}

S3UploadSink::S3UploadSink(const std::string& url, uint64_t part_size, unsigned parts_on_the_wire)
    : where_(parse_s3_url(url)),
      url_(s3_url_string(where_)),
      part_size_(part_size),
      parts_on_the_wire_(parts_on_the_wire) {
  upload_id_ = s3_create_upload(url_);
}

S3UploadSink::~S3UploadSink() { abort(); }

void S3UploadSink::write(const void* data, std::size_t n) {
  if (closed_) fail(ErrorCode::kInternal, url_ + ": write after the upload was closed");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const std::size_t take = std::min<std::size_t>(n, part_size_ - buffer_.size());
    reserve_for(take);
    buffer_.insert(buffer_.end(), p, p + take);
    position_ += take;
    p += take;
    n -= take;
    if (buffer_.size() == part_size_) upload_part();
  }
}

void S3UploadSink::copy_from(const ByteSource& src, uint64_t pos, uint64_t n) {
  if (closed_) fail(ErrorCode::kInternal, url_ + ": write after the upload was closed");
  if (pos > src.size() || n > src.size() - pos) fail_data_loss(src.describe() + ": copy range past the end");
  while (n > 0) {
    const std::size_t filled = buffer_.size();
    const std::size_t take = static_cast<std::size_t>(std::min<uint64_t>(n, part_size_ - filled));
    reserve_for(take);
    buffer_.resize(filled + take);
    src.read(pos, buffer_.data() + filled, take);
    if (src.data()) src.release(pos, take);  // mapped pages read are dropped as for a file sink
    position_ += take;
    pos += take;
    n -= take;
    if (buffer_.size() == part_size_) upload_part();
  }
}

void S3UploadSink::reserve_for(std::size_t n) {
  const std::size_t needed = buffer_.size() + n;
  if (needed <= buffer_.capacity()) return;
  // Doubling as a vector does, but never past the part size: a full part
  // holds part_size bytes, not the next power of two.
  buffer_.reserve(std::min<std::size_t>(part_size_, std::max(needed, 2 * buffer_.capacity())));
}

void S3UploadSink::upload_part() {
  const uint64_t number = parts_.size() + 1;
  if (number > kS3MaxParts)
    fail(ErrorCode::kOutputFailed, url_ + ": more than " + std::to_string(kS3MaxParts) + " parts of " +
                                       std::to_string(part_size_) + " bytes (the output grew past its plan)");
  if (parts_on_the_wire_ == 0) {
    parts_.push_back({number, s3_upload_part(url_, upload_id_, number, buffer_.data(), buffer_.size())});
    buffer_.clear();  // keeps its capacity for the next part
    return;
  }
  std::vector<char> next;  // the buffer the next part fills: one that landed, else a new one
  if (wire_.size() >= parts_on_the_wire_) next = land_oldest();
  parts_.push_back({number, ""});
  OnTheWire sent{parts_.size() - 1, {}, std::move(buffer_)};
  // The bytes live in the deque's element until the part lands; moving the
  // vector keeps its heap block where the thread reads it.
  const char* data = sent.bytes.data();
  const std::size_t n = sent.bytes.size();
  sent.etag = std::async(std::launch::async, [url = url_, id = upload_id_, number, data, n] {
    return s3_upload_part(url, id, number, data, n);
  });
  wire_.push_back(std::move(sent));
  next.clear();
  buffer_ = std::move(next);
}

std::vector<char> S3UploadSink::land_oldest() {
  OnTheWire oldest = std::move(wire_.front());
  wire_.pop_front();
  parts_[oldest.index].etag = oldest.etag.get();  // rethrows the part's failure
  return std::move(oldest.bytes);
}

void S3UploadSink::land_all() {
  std::exception_ptr failed;
  while (!wire_.empty()) {
    try {
      land_oldest();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void S3UploadSink::close() {
  if (closed_) return;
  // The last part may be short; an empty object is one empty part.
  if (!buffer_.empty() || parts_.empty()) upload_part();
  land_all();
  std::vector<char>().swap(buffer_);  // a closed upload keeps no buffer (a run may hold thousands)
  closed_ = true;
}

void S3UploadSink::complete(bool overwrite) {
  close();
  s3_complete_upload(url_, upload_id_, parts_, overwrite);
  done_ = true;
}

void S3UploadSink::abort() noexcept {
  if (done_) return;
  done_ = true;
  try {
    land_all();    // parts still on the wire would land after the abort, and open the upload's parts again
  } catch (...) {  // their failures are why it aborts, and were reported
  }
  s3_abort_upload(url_, upload_id_);
}

std::string s3_create_upload(const std::string& url) {
  const S3Url where = parse_s3_url(url);
  const std::string name = s3_url_string(where);
  if (where.key.empty()) fail_invalid(name + ": an output needs a key after the bucket (s3://BUCKET/KEY)");
  S3Request req = request_for(where, "POST");
  req.query = {{"uploads", ""}};
  S3Response r = send_write(req, name, "starting the upload");
  std::string id = xml_element(r.body, "UploadId").value_or("");
  if (id.empty()) fail(ErrorCode::kOutputFailed, name + ": starting the upload: the answer has no UploadId");
  return id;
}

std::string s3_upload_part(const std::string& url, const std::string& upload_id, uint64_t number, const char* data,
                           std::size_t n) {
  const S3Url where = parse_s3_url(url);
  const std::string name = s3_url_string(where);
  S3Request req = request_for(where, "PUT");
  req.query = {{"partNumber", std::to_string(number)}, {"uploadId", upload_id}};
  req.body = data;
  req.body_size = n;
  S3Response r = send_write(req, name, ("uploading part " + std::to_string(number)).c_str());
  auto etag = r.headers.find("etag");
  if (etag == r.headers.end() || etag->second.empty())
    fail(ErrorCode::kOutputFailed, name + ": part " + std::to_string(number) + ": the answer has no ETag");
  return etag->second;
}

void s3_complete_upload(const std::string& url, const std::string& upload_id, const std::vector<S3UploadedPart>& parts,
                        bool overwrite) {
  const S3Url where = parse_s3_url(url);
  const std::string name = s3_url_string(where);
  std::string body = "<CompleteMultipartUpload>";
  std::vector<std::string> etags;
  for (const auto& part : parts) {
    std::string etag;
    for (char c : part.etag) etag += c == '"' ? std::string("&quot;") : std::string(1, c);
    body += "<Part><PartNumber>" + std::to_string(part.number) + "</PartNumber><ETag>" + etag + "</ETag></Part>";
    etags.push_back(part.etag);
  }
  body += "</CompleteMultipartUpload>";
  S3Request req = request_for(where, "POST");
  req.query = {{"uploadId", upload_id}};
  if (!overwrite) req.headers.push_back("If-None-Match: *");
  req.body = body.data();
  req.body_size = body.size();
  S3Response r = send_write(req, name, "completing the upload", /*judge_lost_answers=*/true);
  // 412 (the object exists) or 404 NoSuchUpload: the object may be this
  // upload, completed by a try whose answer was lost (libcurl itself resends
  // a request whose reused connection died, so tries may say 1). Its ETag
  // tells: the MD5 of this upload's parts' MD5s.
  if ((r.status == 412 || r.status == 404) && !completed_from(where, etags)) {
    if (r.status == 412) fail_invalid(name + ": output exists (use --force to overwrite)");
    fail(ErrorCode::kOutputFailed, name + ": completing the upload failed: " + r.error_text());
  }
}

bool s3_abort_upload(const std::string& url, const std::string& upload_id) noexcept {
  try {
    const S3Url where = parse_s3_url(url);
    S3Request req = request_for(where, "DELETE");
    req.query = {{"uploadId", upload_id}};
    req.cleanup = true;
    S3Response r = default_s3_client().send(req, url);
    if (r.status == 204 || r.status == 200 || r.status == 404) return true;
    log::warn(url + ": cannot abort the unfinished upload (" + r.error_text() +
              "); the bucket's lifecycle rule for incomplete multipart uploads removes its parts");
  } catch (const std::exception& e) {
    log::warn(url + ": cannot abort the unfinished upload (" + std::string(e.what()) +
              "); the bucket's lifecycle rule for incomplete multipart uploads removes its parts");
  }
  return false;
}

void s3_put_object(const std::string& url, const std::string& bytes, bool overwrite) {
  const S3Url where = parse_s3_url(url);
  S3Request req = request_for(where, "PUT");
  if (!overwrite) req.headers.push_back("If-None-Match: *");
  req.body = bytes.data();
  req.body_size = bytes.size();
  send_write(req, s3_url_string(where), "writing");
}

bool s3_put_new_object(const std::string& url, const std::string& bytes) {
  const S3Url where = parse_s3_url(url);
  S3Request req = request_for(where, "PUT");
  req.headers.push_back("If-None-Match: *");
  req.body = bytes.data();
  req.body_size = bytes.size();
  const std::string name = s3_url_string(where);
  const S3Response r = send_write(req, name, "writing", /*judge_lost_answers=*/true);
  if (r.status == 404) fail(ErrorCode::kOutputFailed, name + ": writing failed: " + r.error_text());
  // A 412 may answer the retry of a PUT whose first answer was lost: the
  // object is then these bytes (unique to the caller), and it won.
  return r.status != 412 || s3_get_object(name) == bytes;
}

std::optional<std::string> s3_get_object(const std::string& url) {
  const S3Url where = parse_s3_url(url);
  const std::string name = s3_url_string(where);
  S3Response r;
  try {
    r = default_s3_client().send(request_for(where, "GET"), name);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kDataLoss) throw;
    fail(ErrorCode::kOutputFailed, e.message());
  }
  if (r.status == 404) return std::nullopt;
  if (r.status != 200) fail(ErrorCode::kOutputFailed, name + ": reading failed: " + r.error_text());
  return std::move(r.body);
}

bool s3_delete_object(const std::string& url) noexcept {
  try {
    const S3Url where = parse_s3_url(url);
    S3Request req = request_for(where, "DELETE");
    req.cleanup = true;
    S3Response r = default_s3_client().send(req, s3_url_string(where));
    if (r.status == 204 || r.status == 200) return true;
    log::warn(s3_url_string(where) + ": cannot remove it again (" + r.error_text() + ")");
  } catch (const std::exception& e) {
    log::warn(url + ": cannot remove it again (" + std::string(e.what()) + ")");
  }
  return false;
}

}  // namespace ckpt
