#include "io/s3_client.h"

#include <curl/curl.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <semaphore>
#include <thread>

#include "core/error.h"
#include "core/interrupt.h"

namespace ckpt {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

S3Config s3_config_from_environment() {
  S3Config c;
  const std::string profile = env("AWS_PROFILE").empty() ? "default" : env("AWS_PROFILE");
  const auto found = aws_profile_settings(profile);
  // botocore's ProfileNotFound: a profile asked for by name and in neither
  // file is a mistake (a typo would otherwise sign with the machine's role).
  // A section without keys is there: botocore goes on to the machine's sources.
  if (!found && !env("AWS_PROFILE").empty() && env("AWS_PROFILE") != "default")
    fail_invalid("AWS_PROFILE names profile '" + profile.substr(0, 128) +
                 "', which neither the shared config file nor the credentials file has");
  const auto settings = found.value_or(std::map<std::string, std::string>{});
  if (std::string r = env("AWS_REGION"); !r.empty())
    c.region = r;
  else if (r = env("AWS_DEFAULT_REGION"); !r.empty())
    c.region = r;
  else if (auto it = settings.find("region"); it != settings.end() && !it->second.empty())
    c.region = it->second;
  c.credentials.access_key_id = env("AWS_ACCESS_KEY_ID");
  c.credentials.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
  c.credentials.session_token = env("AWS_SESSION_TOKEN");
  // Fetched keys are fetched on the first request, not here: a run that
  // never signs one (an unsigned public read still asks) costs nothing.
  if (c.credentials.empty()) {
    ProfileCredentials from_profile = profile_credentials(profile, c.region);
    c.credentials = from_profile.keys;
    c.credential_source = from_profile.source;
  }
  c.endpoint = env("AWS_ENDPOINT_URL_S3").empty() ? env("AWS_ENDPOINT_URL") : env("AWS_ENDPOINT_URL_S3");
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  // A custom endpoint (MinIO, moto, Ceph) rarely has wildcard DNS for
  // bucket names: path-style there, virtual-hosted (AWS's only style for new
  // buckets) on AWS, unless asked.
  const std::string style = env("CKPTCONV_S3_ADDRESSING_STYLE");
  c.path_style = style.empty() ? !c.endpoint.empty() : style == "path";
  if (std::string n = env("CKPTCONV_S3_MAX_ATTEMPTS"); !n.empty())
    c.max_attempts = std::clamp(std::atoi(n.c_str()), 1, 20);
  return c;
}

S3Credentials S3Config::current_credentials() const {
  if (!credentials.empty() || !credential_source) return credentials;
  return credential_source->current();
}

std::string S3Response::error_code() const { return xml_element(body, "Code").value_or(""); }

std::string S3Response::error_text() const {
  std::string out = "HTTP " + std::to_string(status);
  if (std::string code = error_code(); !code.empty()) out += " " + code;
  if (auto msg = xml_element(body, "Message")) out += ": " + *msg;
  if (tries > 1) out += " (after " + std::to_string(tries) + " tries)";
  return out;
}

namespace {

std::string sha256_hex(const char* data, std::size_t n) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data ? data : ""), n, digest);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : digest) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

// One handle per thread, reset per request: its connection cache keeps
// keep-alive connections to the endpoint across requests.
CURL* thread_handle() {
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  struct Handle {
    CURL* h = curl_easy_init();
    ~Handle() { curl_easy_cleanup(h); }
  };
  thread_local Handle handle;
  if (!handle.h) fail(ErrorCode::kResourceExhausted, "libcurl: cannot create a handle");
  curl_easy_reset(handle.h);
  return handle.h;
}

struct Transfer {
  CURL* handle;
  const S3Request* req;
  S3Response* resp;
  std::size_t into_written = 0;
  bool overflow = false;
};

std::size_t on_body(char* data, std::size_t size, std::size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t n = size * count;
  long status = 0;
  curl_easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &status);
  if (t->req->into && status >= 200 && status < 300) {
    if (n > t->req->into_size - t->into_written) {
      t->overflow = true;
      return 0;  // more than asked for: abort the transfer
    }
    std::memcpy(t->req->into + t->into_written, data, n);
    t->into_written += n;
  } else {
    t->resp->body.append(data, n);
  }
  return n;
}

std::size_t on_header(char* data, std::size_t size, std::size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t n = size * count;
  std::string line(data, n);
  if (line.rfind("HTTP/", 0) == 0) t->resp->headers.clear();  // a new response (after a 100 Continue)
  const auto colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    t->resp->headers[name] = trimmed(line.substr(colon + 1));
  }
  return n;
}

// libcurl calls this at least once a second, also while a request waits
// on a silent server: Ctrl-C stops a transfer within a second instead of
// after its timeouts and retries.
int on_progress(void* cleanup, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return interrupted_signal() != 0 && cleanup == nullptr ? 1 : 0;
}

bool retryable_status(const S3Response& r) {
  if (r.status == 429 || r.status >= 500) return true;
  const std::string code = r.error_code();
  return code == "SlowDown" || code == "RequestTimeout" || code == "Throttling" || code == "RequestTimeTooSkewed";
}

bool retryable_transport(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM: return true;
    default: return false;  // DNS, TLS verification, bad URL: the same on every try
  }
}

// "Full jitter" (AWS's architecture blog): a uniform wait in [0, 2^try x
// 200 ms], capped at 10 s, so throttled workers do not retry in lockstep.
void back_off(int attempt, bool cleanup) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  const double cap = std::min(10000.0, 200.0 * static_cast<double>(1u << std::min(attempt, 16)));
  std::uniform_real_distribution<double> wait(0.0, cap);
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<int64_t>(wait(rng) * 1000));
  while (std::chrono::steady_clock::now() < until) {  // in short naps, so that Ctrl-C is not kept waiting
    if (!cleanup) check_interrupted();
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(until - std::chrono::steady_clock::now(),
                                                                              std::chrono::milliseconds(50)));
  }
}

}  // namespace

S3Client::S3Client(S3Config config) : config_(std::move(config)) {}

std::string S3Client::url_of(const S3Request& req) const {
  std::string endpoint =
      config_.endpoint.empty() ? "https://s3." + config_.region + ".amazonaws.com" : config_.endpoint;
  std::string url;
  if (config_.path_style) {
    url = endpoint + "/" + req.bucket + "/" + uri_encode(req.key, true);
  } else {
    const auto host = endpoint.find("://");
    url = endpoint.substr(0, host + 3) + req.bucket + "." + endpoint.substr(host + 3) + "/" + uri_encode(req.key, true);
  }
  auto query = req.query;
  std::sort(query.begin(), query.end());
  for (std::size_t i = 0; i < query.size(); ++i) {
    url += i ? '&' : '?';
    url += uri_encode(query[i].first, false) + "=" + uri_encode(query[i].second, false);
  }
  return url;
}

namespace {

// What one try of a request gave: a response, or a transport failure.
struct Attempt {
  CURLcode rc = CURLE_OK;
  S3Response resp;
  std::size_t into_written = 0;  // bytes of a 2xx body that went to S3Request::into
  bool overflow = false;         // the body was longer than into_size
  std::string curl_error;        // libcurl's words when rc != CURLE_OK
};

using HeaderList = std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)>;

// The request's own headers, the payload hash SigV4 signs for S3 and the
// session token. No "Expect:" line to drop 100-continue: libcurl 7.88
// would sign the emptied header it never sends, and S3 would reject it.
HeaderList request_headers(const S3Request& req, const S3Credentials& credentials) {
  HeaderList list(nullptr, curl_slist_free_all);
  auto add = [&](const std::string& line) { list.reset(curl_slist_append(list.release(), line.c_str())); };
  for (const auto& line : req.headers) add(line);
  // Not a form: libcurl's default type for a POSTFIELDS body would be stored as the object's.
  if (req.method != "GET" && req.method != "HEAD") add("Content-Type: application/octet-stream");
  add("x-amz-content-sha256: " + sha256_hex(req.body, req.body_size));
  if (!credentials.session_token.empty()) add("x-amz-security-token: " + credentials.session_token);
  return list;
}

// One try: the handle set up for `req` (timeouts, TLS verification, SigV4),
// performed while holding one of the process's in-flight slots.
Attempt perform_once(const S3Request& req, const std::string& url, const S3Config& config,
                     std::counting_semaphore<1024>& in_flight) {
  Attempt a;
  CURL* h = thread_handle();
  Transfer t{h, &req, &a.resp};
  const S3Credentials credentials = config.current_credentials();
  HeaderList headers = request_headers(req, credentials);
  const std::string range =
      req.range ? std::to_string(req.range->first) + "-" + std::to_string(req.range->second) : std::string();
  const std::string sigv4 = "aws:amz:" + config.region + ":s3";
  char errbuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, config.connect_timeout_ms);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, config.stall_timeout_s);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(h, CURLOPT_FILETIME, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, req.cleanup ? h : nullptr);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  if (!range.empty()) curl_easy_setopt(h, CURLOPT_RANGE, range.c_str());
  if (req.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (req.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body ? req.body : "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body_size));
  }
  if (!credentials.empty()) {
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(h, CURLOPT_USERNAME, credentials.access_key_id.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, credentials.secret_access_key.c_str());
  }
  if (!req.cleanup) check_interrupted();
  in_flight.acquire();
  a.rc = curl_easy_perform(h);
  in_flight.release();
  if (a.rc == CURLE_ABORTED_BY_CALLBACK) check_interrupted();  // throws Interrupted
  a.into_written = t.into_written;
  a.overflow = t.overflow;
  if (a.rc != CURLE_OK) {
    a.curl_error = std::string(curl_easy_strerror(a.rc)) + (errbuf[0] ? std::string(" (") + errbuf + ")" : "");
    return a;
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a.resp.status);
  curl_off_t filetime = -1;
  if (curl_easy_getinfo(h, CURLINFO_FILETIME_T, &filetime) == CURLE_OK) a.resp.last_modified_s = filetime;
  return a;
}

}  // namespace

S3Response S3Client::send(const S3Request& req, const std::string& what) const {
  static std::counting_semaphore<1024> in_flight(std::clamp<unsigned>(config_.max_in_flight, 1, 1024));
  const std::string url = url_of(req);
  const auto started = std::chrono::steady_clock::now();
  auto may_retry = [&](int attempt) {
    return attempt < config_.max_attempts &&
           std::chrono::steady_clock::now() - started < std::chrono::milliseconds(config_.retry_window_ms);
  };
  std::string last_error;
  int attempt = 1;
  for (;; ++attempt) {
    Attempt a = perform_once(req, url, config_, in_flight);
    a.resp.tries = attempt;
    if (a.rc == CURLE_OK) {
      const bool ok = a.resp.status >= 200 && a.resp.status < 300;
      const bool short_body = ok && req.into && req.method != "HEAD" && a.into_written != req.into_size;
      if (!short_body && !(retryable_status(a.resp) && may_retry(attempt))) return a.resp;
      last_error = short_body ? "the response ended after " + std::to_string(a.into_written) + " of " +
                                    std::to_string(req.into_size) + " bytes"
                              : a.resp.error_text();
      if (!may_retry(attempt)) break;
    } else {
      if (a.overflow)
        fail_data_loss(what + ": the service sent more than the " + std::to_string(req.into_size) + " bytes asked for");
      last_error = a.curl_error;
      if (!retryable_transport(a.rc) || !may_retry(attempt)) break;
    }
    back_off(attempt, req.cleanup);
  }
  // The URL without its query: a continuation token says nothing useful.
  fail_data_loss(what + ": " + req.method + " " + url.substr(0, url.find('?')) + " failed" +
                 (attempt > 1 ? " after " + std::to_string(attempt) + " tries" : "") + ": " + last_error);
}

const S3Client& default_s3_client() {
  // Never destroyed: read-ahead threads (io/s3_backend.cc) may still be
  // sending when the process exits.
  static const S3Client* client = new S3Client(s3_config_from_environment());
  return *client;
}

}  // namespace ckpt
