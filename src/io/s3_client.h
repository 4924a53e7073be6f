// HTTP requests to an S3-compatible service: where to send them (endpoint,
// region, path-style or virtual-hosted addressing), how to sign them (SigV4
// through libcurl's CURLOPT_AWS_SIGV4, with the AWS conventions for
// credentials) and what to do when they fail (bounded retries with jittered
// backoff on throttling, 5xx and dropped connections). io/s3_storage.cc
// builds the storage operations on it. Credentials never appear in a
// message: errors name the s3:// URL, the HTTP status and S3's error code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/aws_credentials.h"
#include "io/aws_text.h"

namespace ckpt {

// Everything a request needs besides its own fields, read once from the
// environment (s3_config_from_environment).
struct S3Config {
  S3Credentials credentials;  // written down (environment, shared files)
  // Without them: where keys are fetched from (io/aws_credentials.h); none,
  // or a source that finds none: unsigned requests (public buckets).
  std::shared_ptr<CredentialSource> credential_source;
  // The keys to sign with now.
  S3Credentials current_credentials() const;
  std::string region = "us-east-1";
  std::string endpoint;  // "scheme://host[:port]"; "" = AWS's for the region
  bool path_style = false;
  int max_attempts = 5;            // tries of one request, the first included
  long connect_timeout_ms = 5000;  // per try: an unreachable endpoint fails within a minute in all
  long stall_timeout_s = 10;       // a transfer moving no bytes for this long is retried
  // No new try starts this long after the first began: with the timeouts
  // above, a service that never answers is an error within a minute.
  long retry_window_ms = 40000;
  unsigned max_in_flight = 16;  // requests this process has on the wire at once
};

// The AWS conventions: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
// AWS_SESSION_TOKEN, else what AWS_PROFILE (or [default]) signs with
// (profile_credentials: an assumed role, a web identity, the profile's keys
// in the shared files, credential_process, the container endpoint, EC2
// instance metadata); AWS_REGION / AWS_DEFAULT_REGION / the profile's
// region; AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (MinIO, moto: path-style
// unless CKPTCONV_S3_ADDRESSING_STYLE=virtual); CKPTCONV_S3_MAX_ATTEMPTS.
S3Config s3_config_from_environment();

struct S3Request {
  std::string method = "GET";
  std::string bucket;
  std::string key;  // "" for bucket requests (listing)
  // Query parameters, unencoded; sent sorted by name (the signature's order).
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::string> headers;                    // "Name: value"
  std::optional<std::pair<uint64_t, uint64_t>> range;  // bytes [first, last]
  const char* body = nullptr;                          // PUT/POST payload
  std::size_t body_size = 0;
  // A 2xx response's body goes here (exactly `into_size` bytes expected)
  // instead of S3Response::body: ranged reads land in the caller's buffer.
  char* into = nullptr;
  std::size_t into_size = 0;
  // Undoing an output after an error or Ctrl-C (aborting a multipart
  // upload, deleting an object): sent even once the job was interrupted,
  // which stops every other request.
  bool cleanup = false;
};

struct S3Response {
  long status = 0;
  std::string body;                            // unless S3Request::into took it
  std::map<std::string, std::string> headers;  // names lower-cased
  int64_t last_modified_s = -1;                // seconds since the epoch, when sent
  int tries = 1;                               // how many sends it took
  // S3's <Code> of an error response ("NoSuchKey", "NoSuchBucket", "AccessDenied").
  std::string error_code() const;
  // "HTTP 404 NoSuchBucket: The specified bucket does not exist", and how
  // many tries it took when more than one.
  std::string error_text() const;
};

class S3Client {
 public:
  explicit S3Client(S3Config config);
  const S3Config& config() const { return config_; }
  // Sends `req`, retrying throttling (429, 503, SlowDown), other 5xx,
  // timeouts and dropped connections up to max_attempts with jittered
  // exponential backoff. Returns the last response (any status: callers
  // decide what a 404 means); throws DataLoss naming `what` when no response
  // came (an unreachable endpoint) or a body was cut short on every try.
  S3Response send(const S3Request& req, const std::string& what) const;
  // The URL a request goes to (no credentials in it).
  std::string url_of(const S3Request& req) const;

 private:
  S3Config config_;
};

// The process's client, configured from the environment on first use.
const S3Client& default_s3_client();

}  // namespace ckpt
