#include "io/s3_url.h"

#include "core/error.h"

namespace ckpt {

bool is_s3_url(std::string_view path) { return path.substr(0, kS3Scheme.size()) == kS3Scheme; }

namespace {

bool valid_bucket_name(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
  return true;
}

}  // namespace

S3Url parse_s3_url(const std::string& path) {
  if (!is_s3_url(path)) fail_invalid(path + ": not an s3:// URL");
  std::string rest = path.substr(kS3Scheme.size());
  S3Url out;
  const std::size_t slash = rest.find('/');
  out.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) out.key = rest.substr(slash + 1);
  while (!out.key.empty() && out.key.back() == '/') out.key.pop_back();
  if (!valid_bucket_name(out.bucket))
    fail_invalid(path + ": '" + out.bucket +
                 "' is not a bucket name (3 to 63 characters of a-z, 0-9, '.' and '-'); write s3://BUCKET/PREFIX");
  if (!out.key.empty() && out.key.front() == '/')
    fail_invalid(path + ": the key starts with '/' (s3://BUCKET//...); write s3://BUCKET/PREFIX");
  return out;
}

std::string s3_url_string(const S3Url& url) {
  return url.key.empty() ? std::string(kS3Scheme) + url.bucket : std::string(kS3Scheme) + url.bucket + "/" + url.key;
}

}  // namespace ckpt
