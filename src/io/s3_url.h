// s3://BUCKET/KEY names: what storage_for() recognises and the S3 backend
// (io/s3_storage.h) splits into a bucket and a key. Lexical only.
#pragma once

#include <string>
#include <string_view>

namespace ckpt {

inline constexpr std::string_view kS3Scheme = "s3://";

struct S3Url {
  std::string bucket;
  std::string key;  // "" for the bucket itself; never starts with '/'
};

// The path names an object or prefix in a bucket (starts with "s3://").
bool is_s3_url(std::string_view path);
// BUCKET and KEY of an s3:// path; trailing slashes dropped from the key
// (a "directory" is the prefix KEY + "/"). InvalidArgument naming the path
// when it has no bucket or the bucket name cannot be one (S3's rules: 3 to
// 63 characters of a-z, 0-9, '.', '-').
S3Url parse_s3_url(const std::string& path);
// "s3://BUCKET/KEY" ("s3://BUCKET" for an empty key).
std::string s3_url_string(const S3Url& url);

}  // namespace ckpt
