#include "io/aws_credentials.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/sha.h>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "io/aws_text.h"

extern char** environ;

namespace ckpt {
namespace {

using Clock = std::chrono::system_clock;
// Keys this close to their expiry are fetched again (botocore refreshes
// 15 minutes ahead for its advisory window and 10 for the mandatory one).
constexpr std::chrono::minutes kRefreshAhead{5};
constexpr std::size_t kMaxAnswer = 1 << 20;  // a credentials document is a few hundred bytes

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct HttpAnswer {
  CURLcode rc = CURLE_OK;
  long status = 0;
  std::string body;
};

size_t collect(char* data, size_t size, size_t n, void* user) {
  auto* body = static_cast<std::string*>(user);
  if (body->size() + size * n > kMaxAnswer) return 0;  // ends the transfer: no endpoint answers megabytes
  body->append(data, size * n);
  return size * n;
}

// What signs a request to STS: keys and curl's SigV4 provider string
// ("aws:amz:REGION:sts").
struct Signing {
  S3Credentials keys;
  std::string sigv4;
};

// One plain HTTP(S) request of the credential endpoints (not S3's: no
// retries beyond `tries`), with its own handle; signed when `sign` is given.
HttpAnswer http(const std::string& method, const std::string& url, std::vector<std::string> headers,
                const std::string& body, long timeout_ms, int tries = 1, const Signing* sign = nullptr) {
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (sign && !sign->keys.session_token.empty()) headers.push_back("X-Amz-Security-Token: " + sign->keys.session_token);
  HttpAnswer a;
  for (int t = 0; t < tries; ++t) {
    std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> h(curl_easy_init(), curl_easy_cleanup);
    if (!h) fail(ErrorCode::kResourceExhausted, "libcurl: cannot create a handle");
    std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> list(nullptr, curl_slist_free_all);
    for (const auto& line : headers) list.reset(curl_slist_append(list.release(), line.c_str()));
    a = HttpAnswer{};
    curl_easy_setopt(h.get(), CURLOPT_URL, url.c_str());
    curl_easy_setopt(h.get(), CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h.get(), CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h.get(), CURLOPT_TIMEOUT_MS, timeout_ms * 3);
    curl_easy_setopt(h.get(), CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h.get(), CURLOPT_SSL_VERIFYHOST, 2L);
    curl_easy_setopt(h.get(), CURLOPT_HTTPHEADER, list.get());
    curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &a.body);
    if (method != "GET") {
      curl_easy_setopt(h.get(), CURLOPT_CUSTOMREQUEST, method.c_str());
      curl_easy_setopt(h.get(), CURLOPT_POSTFIELDS, body.c_str());
      curl_easy_setopt(h.get(), CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    }
    if (sign) {
      curl_easy_setopt(h.get(), CURLOPT_AWS_SIGV4, sign->sigv4.c_str());
      curl_easy_setopt(h.get(), CURLOPT_USERNAME, sign->keys.access_key_id.c_str());
      curl_easy_setopt(h.get(), CURLOPT_PASSWORD, sign->keys.secret_access_key.c_str());
    }
    a.rc = curl_easy_perform(h.get());
    if (a.rc == CURLE_OK) curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &a.status);
    if (a.rc == CURLE_OK && a.status < 500) break;
  }
  return a;
}

std::string read_small_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kNotFound, what + ": cannot read " + path);
  // Tokens and credential documents are kilobytes: a larger file is not one.
  std::string text(kMaxAnswer + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxAnswer) fail_data_loss(what + ": " + path + " is larger than 1 MiB");
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

// The JSON the container endpoint, IMDS and credential_process answer:
// AccessKeyId, SecretAccessKey, Token or SessionToken, Expiration.
TimedCredentials from_json(const std::string& text, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  auto field = [&](const char* name) -> std::string {
    if (!j.is_object() || !j.contains(name)) return "";
    return j[name].is_string() ? j[name].get<std::string>() : "";
  };
  TimedCredentials c;
  c.keys.access_key_id = field("AccessKeyId");
  c.keys.secret_access_key = field("SecretAccessKey");
  c.keys.session_token = field("Token").empty() ? field("SessionToken") : field("Token");
  if (c.keys.empty()) fail_data_loss(what + ": the answer holds no AccessKeyId and SecretAccessKey");
  if (std::string e = field("Expiration"); !e.empty()) {
    c.expires = parse_iso8601_utc(e);
    if (!c.expires) fail_data_loss(what + ": Expiration '" + e.substr(0, 40) + "' is not an ISO 8601 time");
  }
  return c;
}

std::string answer_error(const HttpAnswer& a) {
  if (a.rc != CURLE_OK) return curl_easy_strerror(a.rc);
  return "HTTP " + std::to_string(a.status);
}

// credential_process: run without a shell, its stdout a JSON document of
// Version 1; its stderr goes to ours (the tool's own prompts and errors).
TimedCredentials run_credential_process(const std::string& line, const std::string& what) {
  std::vector<std::string> args = split_command_line(line);
  if (args.empty()) fail_invalid(what + " is empty");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) fail(ErrorCode::kResourceExhausted, what + ": pipe: " + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    fail(ErrorCode::kNotFound, what + ": cannot run '" + args[0] + "': " + std::strerror(rc));
  }
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (text.size() < kMaxAnswer) text.append(buf, static_cast<std::size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_data_loss(what + ": '" + args[0] + "' failed (" +
                   (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : std::string("killed")) + ")");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("Version") || j["Version"] != 1)
    fail_data_loss(what + ": its output is not a credentials document of Version 1");
  return from_json(text, what);
}

// botocore's configured endpoints: AWS_ENDPOINT_URL_<SERVICE ID> (the id in
// capitals, spaces as '_': STS, SSO, SSO_OIDC), else AWS_ENDPOINT_URL, else
// AWS's own address for the service.
std::string service_endpoint(const std::string& service_id, const std::string& aws_default) {
  std::string endpoint = env(("AWS_ENDPOINT_URL_" + service_id).c_str());
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = aws_default;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint;
}

std::string sts_endpoint(const std::string& region) {
  return service_endpoint("STS",
                          region.empty() ? "https://sts.amazonaws.com" : "https://sts." + region + ".amazonaws.com");
}

// An STS query-API call (form body, XML answer) whose answer holds
// <Credentials>: AssumeRole and AssumeRoleWithWebIdentity.
TimedCredentials sts_credentials(const std::string& action, const std::string& params, const std::string& region,
                                 const Signing* sign, const std::string& what) {
  const std::string endpoint = sts_endpoint(region);
  const std::string body = "Action=" + action + "&Version=2011-06-15" + params;
  HttpAnswer a = http("POST", endpoint + "/", {"Content-Type: application/x-www-form-urlencoded; charset=utf-8"}, body,
                      5000, 3, sign);
  if (a.rc != CURLE_OK || a.status != 200) {
    std::string why = answer_error(a);
    if (auto code = xml_element(a.body, "Code")) why += " " + code->substr(0, 80);
    if (auto msg = xml_element(a.body, "Message")) why += ": " + msg->substr(0, 200);
    fail_data_loss(what + ": STS " + action + " at " + endpoint + " failed: " + why);
  }
  auto element = [&](const char* tag) { return xml_element(a.body, tag).value_or(""); };
  nlohmann::json j = {{"AccessKeyId", element("AccessKeyId")},
                      {"SecretAccessKey", element("SecretAccessKey")},
                      {"SessionToken", element("SessionToken")},
                      {"Expiration", element("Expiration")}};
  return from_json(j.dump(), what);
}

TimedCredentials assume_role_with_web_identity(const std::string& token_file, const std::string& role_arn,
                                               const std::string& session, const std::string& region) {
  const std::string what = "web identity (" + token_file + ")";
  const std::string token = read_small_file(token_file, what);
  // Unsigned: the token is the proof (AssumeRoleWithWebIdentity takes no keys).
  return sts_credentials("AssumeRoleWithWebIdentity",
                         "&RoleArn=" + uri_encode(role_arn, false) + "&RoleSessionName=" + uri_encode(session, false) +
                             "&WebIdentityToken=" + uri_encode(token, false),
                         region, nullptr, what);
}

TimedCredentials container_credentials() {
  std::string url = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  if (std::string rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"); !rel.empty()) url = "http://169.254.170.2" + rel;
  const std::string what = "the container credentials endpoint (" + url + ")";
  std::vector<std::string> headers;
  std::string token = env("AWS_CONTAINER_AUTHORIZATION_TOKEN");
  if (std::string file = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"); !file.empty())
    token = read_small_file(file, what);
  if (!token.empty()) headers.push_back("Authorization: " + token);
  HttpAnswer a = http("GET", url, headers, "", 2000, 3);
  if (a.rc != CURLE_OK || a.status != 200) fail_data_loss(what + " failed: " + answer_error(a));
  return from_json(a.body, what);
}

// IMDSv2: a session token (PUT), the role's name, its keys. No service
// there (not on EC2) is no keys: requests go unsigned, as before.
TimedCredentials instance_metadata_credentials() {
  std::string base = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (base.empty()) base = "http://169.254.169.254";
  while (!base.empty() && base.back() == '/') base.pop_back();
  HttpAnswer t = http("PUT", base + "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds: 21600"}, "", 1000);
  if (t.rc != CURLE_OK || t.status != 200) {
    log::debug("no EC2 instance metadata service at " + base + " (" + answer_error(t) + "): unsigned requests");
    return {};
  }
  const std::string auth = "X-aws-ec2-metadata-token: " + t.body;
  const std::string path = base + "/latest/meta-data/iam/security-credentials/";
  HttpAnswer role = http("GET", path, {auth}, "", 1000, 2);
  if (role.rc != CURLE_OK || role.status != 200) {
    log::debug("the instance metadata service has no role (" + answer_error(role) + "): unsigned requests");
    return {};
  }
  const std::string name = role.body.substr(0, role.body.find('\n'));
  HttpAnswer keys = http("GET", path + name, {auth}, "", 1000, 2);
  const std::string what = "the EC2 instance metadata service (role '" + name.substr(0, 64) + "')";
  if (keys.rc != CURLE_OK || keys.status != 200) fail_data_loss(what + " failed: " + answer_error(keys));
  return from_json(keys.body, what);
}

// IAM Identity Center (SSO): the token `aws sso login` cached, exchanged
// for the role's keys at the portal's GetRoleCredentials, as botocore's
// SSOProvider does. In the sso-session form a token about to expire is
// refreshed first with the refresh token cached beside it (SSO-OIDC
// CreateToken), as botocore's SSOTokenProvider does; one that has expired
// and cannot be refreshed is an error that says to log in again.
struct SsoProfile {
  std::string start_url, region, account, role;
  std::string session;  // the [sso-session NAME] it names; "" in the legacy form
};

std::string sha1_hex(const std::string& text) {
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : digest) out += {kHex[c >> 4], kHex[c & 15]};
  return out;
}

// botocore's SSOTokenProvider refreshes a token with less than this left.
constexpr std::chrono::minutes kSsoTokenRefreshWindow{15};

std::string json_string(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// A flat object as Python's json.dumps writes it (", " and ": " between
// items, non-ASCII escaped), its keys in the order given: botocore's
// JSONFileCache writes the token cache so, and a file both rewrite stays
// the same file.
std::string python_json_dumps(const nlohmann::ordered_json& doc) {
  std::string out = "{";
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it != doc.begin()) out += ", ";
    out += nlohmann::json(it.key()).dump(-1, ' ', true) + ": " + it.value().dump(-1, ' ', true);
  }
  return out + "}";
}

// As botocore's JSONFileCache: a temporary file of mode 0600 in the same
// folder, synced, renamed over the old one; a reader sees the old token or
// the new, never half of one.
void replace_file_atomically(const std::string& path, const std::string& text) {
  std::string temp = path.substr(0, path.rfind('/') + 1) + "ckptconv-XXXXXX.tmp";
  const int fd = mkstemps(temp.data(), 4);
  if (fd < 0)
    fail(ErrorCode::kOutputFailed, "cannot create a temporary file beside " + path + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  const bool ok = done == text.size() && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(ok ? errno : err);
    ::unlink(temp.c_str());
    fail(ErrorCode::kOutputFailed, "cannot write " + path + ": " + why);
  }
}

// botocore's SSOTokenProvider._refresh_access_token: SSO-OIDC CreateToken
// with the cached refresh token and client registration, giving the token
// to cache (its keys and their order botocore's); nullopt, the reason in
// *why, when the cache holds nothing to refresh with or CreateToken fails.
std::optional<nlohmann::ordered_json> refreshed_sso_token(const SsoProfile& sso, const nlohmann::json& cached,
                                                          std::string* why) {
  for (const char* key : {"refreshToken", "clientId", "clientSecret", "registrationExpiresAt"})
    if (!cached.contains(key)) {
      *why = std::string("the cache holds no ") + key;
      return std::nullopt;
    }
  const auto registration = parse_iso8601_utc(json_string(cached, "registrationExpiresAt"));
  if (!registration || *registration <= Clock::now()) {
    *why = "its client registration has expired";
    return std::nullopt;
  }
  const std::string endpoint = service_endpoint("SSO_OIDC", "https://oidc." + sso.region + ".amazonaws.com");
  const nlohmann::ordered_json request = {{"grantType", "refresh_token"},
                                          {"clientId", cached["clientId"]},
                                          {"clientSecret", cached["clientSecret"]},
                                          {"refreshToken", cached["refreshToken"]}};
  // Unsigned: the refresh token and the client secret are the proof.
  HttpAnswer a = http("POST", endpoint + "/token", {"Content-Type: application/json"}, request.dump(), 5000, 3);
  const nlohmann::json answer = nlohmann::json::parse(a.body, nullptr, false);
  if (a.rc != CURLE_OK || a.status != 200) {
    *why = "SSO-OIDC CreateToken at " + endpoint + " failed: " + answer_error(a);
    if (answer.is_object()) {
      if (std::string code = json_string(answer, "error"); !code.empty()) *why += " " + code.substr(0, 80);
    }
    return std::nullopt;
  }
  // A lifetime past ten years is no token's (and would overflow the clock).
  constexpr int64_t kLongestLifetime = 10LL * 366 * 24 * 3600;
  if (!answer.is_object() || json_string(answer, "accessToken").empty() || !answer.contains("expiresIn") ||
      !answer["expiresIn"].is_number_integer() || answer["expiresIn"].get<int64_t>() < 0 ||
      answer["expiresIn"].get<int64_t>() > kLongestLifetime) {
    *why = "SSO-OIDC CreateToken at " + endpoint + " answered without accessToken and a valid expiresIn";
    return std::nullopt;
  }
  nlohmann::ordered_json token = {
      {"startUrl", sso.start_url},
      {"region", sso.region},
      {"accessToken", answer["accessToken"]},
      {"expiresAt", format_iso8601_utc(Clock::now() + std::chrono::seconds(answer["expiresIn"].get<int64_t>()))},
      {"clientId", cached["clientId"]},
      {"clientSecret", cached["clientSecret"]},
      {"registrationExpiresAt", cached["registrationExpiresAt"]}};
  if (answer.contains("refreshToken")) token["refreshToken"] = answer["refreshToken"];
  return token;
}

TimedCredentials sso_role_credentials(const SsoProfile& sso, const std::string& what) {
  // botocore's SSOTokenLoader: ~/.aws/sso/cache/<sha1 of the session name, or of the start URL>.json
  const std::string home = env("HOME");
  const std::string cache =
      home + "/.aws/sso/cache/" + sha1_hex(sso.session.empty() ? sso.start_url : sso.session) + ".json";
  const std::string login =
      sso.session.empty() ? "aws sso login --profile ..." : "aws sso login --sso-session " + sso.session;
  if (!std::ifstream(cache)) fail_data_loss(what + ": no cached SSO token (" + cache + "): run `" + login + "`");
  nlohmann::json j = nlohmann::json::parse(read_small_file(cache, what), nullptr, false);
  if (!j.is_object() || !j.contains("accessToken") || !j["accessToken"].is_string() || !j.contains("expiresAt") ||
      !j["expiresAt"].is_string())
    fail_data_loss(what + ": the cached SSO token " + cache + " has no accessToken and expiresAt");
  std::string token = j["accessToken"].get<std::string>();
  auto expires = parse_iso8601_utc(j["expiresAt"].get<std::string>());
  if (!expires) fail_data_loss(what + ": the cached SSO token's expiresAt is not an ISO 8601 time");
  std::string refresh_failed;
  // The legacy form has no refresh (botocore refreshes only sso-session tokens).
  if (!sso.session.empty() && *expires - Clock::now() < kSsoTokenRefreshWindow) {
    if (auto fresh = refreshed_sso_token(sso, j, &refresh_failed)) {
      token = (*fresh)["accessToken"].get<std::string>();
      expires = parse_iso8601_utc((*fresh)["expiresAt"].get<std::string>());
      try {
        replace_file_atomically(cache, python_json_dumps(*fresh));
        log::info("refreshed the SSO token of sso-session '" + sso.session + "' (" + cache + ")");
      } catch (const Error& e) {
        // The new token still signs this run; the next one logs in again.
        log::warn(what + ": the refreshed SSO token could not be cached: " + e.message());
      }
    } else if (*expires > Clock::now()) {
      // botocore logs a refused refresh and goes on with the token it has
      // (an unreachable SSO-OIDC stops botocore; here it is the same warning).
      log::warn(what + ": the SSO token expires within " + std::to_string(kSsoTokenRefreshWindow.count()) +
                " minutes and was not refreshed (" + refresh_failed + "): going on with it");
    }
  }
  if (*expires <= Clock::now())
    fail_data_loss(what + ": the SSO token has expired" +
                   (refresh_failed.empty() ? "" : " and was not refreshed (" + refresh_failed + ")") + ": run `" +
                   login + "`");
  const std::string endpoint = service_endpoint("SSO", "https://portal.sso." + sso.region + ".amazonaws.com");
  const std::string url = endpoint + "/federation/credentials?account_id=" + uri_encode(sso.account, false) +
                          "&role_name=" + uri_encode(sso.role, false);
  HttpAnswer a = http("GET", url, {"x-amz-sso_bearer_token: " + token}, "", 5000, 3);
  if (a.rc == CURLE_OK && (a.status == 401 || a.status == 403))
    fail_data_loss(what + ": the SSO portal refused the token (HTTP " + std::to_string(a.status) + "): run `" + login +
                   "`");
  if (a.rc != CURLE_OK || a.status != 200)
    fail_data_loss(what + ": GetRoleCredentials at " + endpoint + " failed: " + answer_error(a));
  nlohmann::json r = nlohmann::json::parse(a.body, nullptr, false);
  if (!r.is_object() || !r.contains("roleCredentials") || !r["roleCredentials"].is_object())
    fail_data_loss(what + ": GetRoleCredentials answered without roleCredentials");
  const nlohmann::json& c = r["roleCredentials"];
  auto field = [&](const char* name) {
    return c.contains(name) && c[name].is_string() ? c[name].get<std::string>() : "";
  };
  TimedCredentials out;
  out.keys = {field("accessKeyId"), field("secretAccessKey"), field("sessionToken")};
  if (out.keys.empty()) fail_data_loss(what + ": GetRoleCredentials answered without accessKeyId and secretAccessKey");
  // milliseconds since the epoch
  if (c.contains("expiration") && c["expiration"].is_number_integer())
    out.expires = Clock::time_point(std::chrono::milliseconds(c["expiration"].get<int64_t>()));
  return out;
}

std::shared_ptr<CredentialSource> container_source() {
  return std::make_shared<CredentialSource>("the container credentials endpoint", container_credentials);
}

std::shared_ptr<CredentialSource> instance_metadata_source() {
  return std::make_shared<CredentialSource>("the EC2 instance metadata service", instance_metadata_credentials);
}

}  // namespace

CredentialSource::CredentialSource(std::string name, std::function<TimedCredentials()> fetch)
    : name_(std::move(name)), fetch_(std::move(fetch)) {}

S3Credentials CredentialSource::current() {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool stale = held_ && held_->expires && Clock::now() + kRefreshAhead >= *held_->expires;
  if (!held_ || stale) {
    held_ = fetch_();
    if (!held_->keys.empty()) log::debug("S3 credentials from " + name_);
  }
  return held_->keys;
}

namespace {

// The keys of section `section` of an INI file (the AWS shared files);
// nullopt when the file or the section is missing (a section without keys
// is there: botocore takes it as the profile).
std::optional<std::map<std::string, std::string>> ini_section(const std::string& file, const std::string& section) {
  std::optional<std::map<std::string, std::string>> out;
  std::ifstream in(file);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    line = trimmed(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      inside = trimmed(line.substr(1, line.size() - 2)) == section;
      if (inside && !out) out.emplace();
      continue;
    }
    const auto eq = line.find('=');
    if (inside && eq != std::string::npos) (*out)[trimmed(line.substr(0, eq))] = trimmed(line.substr(eq + 1));
  }
  return out;
}

std::string home_file(const char* env_name, const char* relative) {
  if (std::string named = env(env_name); !named.empty()) return named;
  const std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/" + relative;
}

using Settings = std::map<std::string, std::string>;

std::string setting(const Settings& s, const char* key) {
  auto it = s.find(key);
  return it == s.end() ? std::string() : it->second;
}

bool has_static_keys(const Settings& s) { return s.count("aws_access_key_id") || s.count("aws_secret_access_key"); }

S3Credentials static_keys(const Settings& s, const std::string& profile) {
  S3Credentials k{setting(s, "aws_access_key_id"), setting(s, "aws_secret_access_key"),
                  setting(s, "aws_session_token")};
  if (k.empty()) fail_invalid("profile '" + profile + "' has only one of aws_access_key_id and aws_secret_access_key");
  return k;
}

// A role to assume: botocore's AssumeRoleProvider applies to a profile with
// role_arn and no web identity token file.
bool assumes_role(const Settings& s) { return s.count("role_arn") && !s.count("web_identity_token_file"); }

using KeysGetter = std::function<S3Credentials()>;

// credential_source: keys of this machine's environment, as botocore's
// CanonicalNameCredentialSourcer names them.
KeysGetter named_credential_source(const std::string& name, const std::string& profile) {
  if (name == "Environment") {
    S3Credentials k{env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN")};
    if (k.empty())
      fail_invalid("profile '" + profile +
                   "': credential_source Environment, but AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY are not set");
    return [k] { return k; };
  }
  std::shared_ptr<CredentialSource> source;
  if (name == "EcsContainer")
    source = container_source();
  else if (name == "Ec2InstanceMetadata")
    source = instance_metadata_source();
  else
    fail_invalid("profile '" + profile + "': credential_source '" + name.substr(0, 64) +
                 "' is not one of Environment, Ec2InstanceMetadata, EcsContainer");
  return [source, profile] {
    S3Credentials k = source->current();
    if (k.empty()) fail_data_loss("profile '" + profile + "': " + source->name() + " gave no keys");
    return k;
  };
}

// A profile that names an SSO account and role (sso_account_id,
// sso_role_name), with its portal and region from the [sso-session NAME]
// section it names or (the legacy form) from itself; nullopt when it names
// none. Missing or contradicting settings are an InvalidArgument naming them.
std::optional<SsoProfile> sso_profile(const Settings& s, const std::string& profile) {
  if (!s.count("sso_account_id") && !s.count("sso_role_name")) return std::nullopt;
  Settings all = s;
  SsoProfile sso;
  if (std::string name = setting(s, "sso_session"); !name.empty()) {
    // An empty [sso-session] is none to botocore too (its `if not sso_config`).
    const Settings session =
        ini_section(home_file("AWS_CONFIG_FILE", ".aws/config"), "sso-session " + name).value_or(Settings{});
    if (session.empty()) fail_invalid("profile '" + profile + "': the sso-session '" + name + "' does not exist");
    for (const auto& [k, v] : session) {
      if (all.count(k) && all[k] != v)
        fail_invalid("profile '" + profile + "': " + k + " is '" + all[k] + "' in the profile and '" + v +
                     "' in sso-session '" + name + "'");
      all[k] = v;
    }
    sso.session = name;
  }
  std::string missing;
  for (const char* key : {"sso_start_url", "sso_region", "sso_account_id", "sso_role_name"})
    if (setting(all, key).empty()) missing += std::string(missing.empty() ? "" : ", ") + key;
  if (!missing.empty()) fail_invalid("profile '" + profile + "' is configured to use SSO but has no " + missing);
  sso.start_url = setting(all, "sso_start_url");
  sso.region = setting(all, "sso_region");
  sso.account = setting(all, "sso_account_id");
  sso.role = setting(all, "sso_role_name");
  return sso;
}

ProfileCredentials resolve_profile(const std::string& profile, const std::string& region, bool use_env,
                                   std::vector<std::string>& visited);

// The keys the source of an assumed role signs STS's AssumeRole with.
KeysGetter role_source_keys(const Settings& s, const std::string& profile, const std::string& region,
                            std::vector<std::string>& visited) {
  const std::string source_profile = setting(s, "source_profile"), named = setting(s, "credential_source");
  if (!source_profile.empty() && !named.empty())
    fail_invalid("profile '" + profile + "' has both source_profile and credential_source");
  if (!named.empty()) return named_credential_source(named, profile);
  if (source_profile.empty())
    fail_invalid("profile '" + profile + "' has role_arn but neither source_profile nor credential_source");
  const std::optional<Settings> found = aws_profile_settings(source_profile);
  if (!found) fail_invalid("the source_profile '" + source_profile + "' of profile '" + profile + "' does not exist");
  // A profile may name itself to sign with its own keys; any other profile
  // met twice is a loop.
  const Settings& src = *found;
  if (source_profile == profile) {
    if (!has_static_keys(src)) fail_invalid("profile '" + profile + "' is its own source_profile but has no keys");
    S3Credentials k = static_keys(src, profile);
    return [k] { return k; };
  }
  if (std::find(visited.begin(), visited.end(), source_profile) != visited.end())
    fail_invalid("the source_profile chain of profile '" + visited.front() + "' loops back to '" + source_profile +
                 "'");
  visited.push_back(source_profile);
  ProfileCredentials chained = resolve_profile(source_profile, region, false, visited);
  if (!chained.source && chained.keys.empty())
    fail_invalid("the source_profile '" + source_profile + "' of profile '" + profile + "' has no credentials");
  if (!chained.source) return [k = chained.keys] { return k; };
  return [source = chained.source, source_profile] {
    S3Credentials k = source->current();
    if (k.empty()) fail_data_loss("source_profile '" + source_profile + "': " + source->name() + " gave no keys");
    return k;
  };
}

std::shared_ptr<CredentialSource> assume_role(const Settings& s, const std::string& profile, const std::string& region,
                                              std::vector<std::string>& visited) {
  if (s.count("mfa_serial"))
    fail_invalid("profile '" + profile +
                 "' assumes its role with an MFA code (mfa_serial), which ckptconv cannot "
                 "ask for: run with the keys of a session (aws sts get-session-token, AWS_SESSION_TOKEN) instead");
  KeysGetter source = role_source_keys(s, profile, region, visited);
  std::string params = "&RoleArn=" + uri_encode(setting(s, "role_arn"), false);
  std::string session = setting(s, "role_session_name");
  if (session.empty()) session = "ckptconv-session-" + std::to_string(std::time(nullptr));
  params += "&RoleSessionName=" + uri_encode(session, false);
  if (std::string id = setting(s, "external_id"); !id.empty()) params += "&ExternalId=" + uri_encode(id, false);
  // botocore passes duration_seconds only when it is an integer.
  if (std::string d = setting(s, "duration_seconds");
      !d.empty() && d.find_first_not_of("0123456789") == std::string::npos)
    params += "&DurationSeconds=" + d;
  const std::string signing_region = region.empty() ? "us-east-1" : region;
  const std::string what = "the role of profile '" + profile + "'";
  return std::make_shared<CredentialSource>(what, [=] {
    const Signing sign{source(), "aws:amz:" + signing_region + ":sts"};
    return sts_credentials("AssumeRole", params, region, &sign, what);
  });
}

// botocore's chain for one profile (the environment's keys were looked at
// by the caller; `use_env` says whether the environment's web identity
// settings apply: not for a source profile).
ProfileCredentials resolve_profile(const std::string& profile, const std::string& region, bool use_env,
                                   std::vector<std::string>& visited) {
  const Settings s = aws_profile_settings(profile).value_or(Settings{});
  if (assumes_role(s)) return {{}, assume_role(s, profile, region, visited)};
  std::string token_file = use_env ? env("AWS_WEB_IDENTITY_TOKEN_FILE") : "", role = use_env ? env("AWS_ROLE_ARN") : "";
  std::string session = use_env ? env("AWS_ROLE_SESSION_NAME") : "";
  if (token_file.empty() || role.empty()) {
    token_file = setting(s, "web_identity_token_file");
    role = setting(s, "role_arn");
    if (session.empty()) session = setting(s, "role_session_name");
  }
  if (!token_file.empty() && !role.empty()) {
    if (session.empty()) session = "ckptconv-" + std::to_string(::getpid());
    return {{}, std::make_shared<CredentialSource>("the web identity token " + token_file, [=] {
              return assume_role_with_web_identity(token_file, role, session, region);
            })};
  }
  if (auto sso = sso_profile(s, profile)) {
    std::string what = "the SSO role of profile '" + profile + "'";
    return {{},
            std::make_shared<CredentialSource>(what, [sso = *sso, what] { return sso_role_credentials(sso, what); })};
  }
  if (has_static_keys(s)) return {static_keys(s, profile), nullptr};
  if (std::string process = setting(s, "credential_process"); !process.empty()) {
    std::string what = "the credential_process of profile '" + profile + "'";
    return {{}, std::make_shared<CredentialSource>(what, [process, what] {
              return run_credential_process(process, what);
            })};
  }
  if (!use_env) return {};  // a source profile does not fall through to this machine's endpoints
  if (!env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").empty() || !env("AWS_CONTAINER_CREDENTIALS_FULL_URI").empty())
    return {{}, container_source()};
  if (lower(env("AWS_EC2_METADATA_DISABLED")) == "true") return {};
  return {{}, instance_metadata_source()};
}

}  // namespace

std::optional<std::map<std::string, std::string>> aws_profile_settings(const std::string& name) {
  // The config file names a profile "[profile NAME]", except [default].
  auto s = ini_section(home_file("AWS_CONFIG_FILE", ".aws/config"), name == "default" ? name : "profile " + name);
  if (auto keys = ini_section(home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), name)) {
    if (!s) s.emplace();
    for (auto& [k, v] : *keys) (*s)[k] = v;
  }
  return s;
}

ProfileCredentials profile_credentials(const std::string& profile, const std::string& region) {
  std::vector<std::string> visited{profile};
  return resolve_profile(profile, region, true, visited);
}

std::vector<std::string> split_command_line(const std::string& line) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '\'') {  // literal up to the next quote
      const auto end = line.find('\'', i + 1);
      if (end == std::string::npos) fail_invalid("credential_process: no closing quotation");
      word += line.substr(i + 1, end - i - 1);
      i = end;
      in_word = true;
    } else if (c == '"') {  // backslash escapes only \ and " (shlex, not sh)
      std::size_t j = i + 1;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size() && std::strchr("\\\"", line[j + 1])) ++j;
        word += line[j];
      }
      if (j >= line.size()) fail_invalid("credential_process: no closing quotation");
      i = j;
      in_word = true;
    } else if (c == '\\') {
      if (i + 1 >= line.size()) fail_invalid("credential_process: no escaped character");
      word += line[++i];
      in_word = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_word) out.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) out.push_back(word);
  return out;
}

std::string format_iso8601_utc(Clock::time_point t) {
  const time_t seconds = Clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::optional<Clock::time_point> parse_iso8601_utc(const std::string& text) {
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &consumed) != 6)
    return std::nullopt;
  std::string rest = text.substr(static_cast<std::size_t>(consumed));
  if (!rest.empty() && rest[0] == '.') rest.erase(0, rest.find_first_not_of("0123456789", 1));
  if (rest != "Z" && rest != "+00:00" && rest != "UTC" && rest != "") return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  const time_t t = timegm(&tm);
  if (t == static_cast<time_t>(-1)) return std::nullopt;
  return Clock::from_time_t(t);
}

}  // namespace ckpt
