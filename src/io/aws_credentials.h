// AWS credentials that are fetched rather than written down: a role assumed
// with another profile's keys, a profile's `credential_process`, a web
// identity token exchanged with STS (EKS IRSA),
// the ECS/EKS container endpoint, and the EC2 instance metadata service
// (IMDSv2). Each gives temporary keys with an expiry; a CredentialSource
// fetches them on first use and again when they are within five minutes of
// expiring, so a run longer than their lifetime keeps signing. The order
// is botocore's (io/s3_client.h: keys in the environment and the shared
// files come first). Keys never appear in a message.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials only
  bool empty() const { return access_key_id.empty() || secret_access_key.empty(); }
};

struct TimedCredentials {
  S3Credentials keys;  // empty: none there (no instance metadata service): unsigned requests
  std::optional<std::chrono::system_clock::time_point> expires;
};

class CredentialSource {
 public:
  // `name` says where the keys come from, for messages ("the
  // credential_process of profile 'ml'"); `fetch` gets them, throwing an
  // Error naming the source when it fails.
  CredentialSource(std::string name, std::function<TimedCredentials()> fetch);
  // The keys to sign with now.
  S3Credentials current();
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::function<TimedCredentials()> fetch_;
  std::mutex mutex_;
  std::optional<TimedCredentials> held_;
};

// The settings of profile `name` in the shared files: its section of the
// config file (AWS_CONFIG_FILE, ~/.aws/config: [profile NAME], or
// [default]) with those of its section of the credentials file
// (AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials: [NAME]) over them, as
// botocore merges the two. nullopt when neither file has it; a section
// there without keys is a profile with no settings, as botocore takes it.
std::optional<std::map<std::string, std::string>> aws_profile_settings(const std::string& name);

// What `profile` signs with when the environment holds no keys: written
// down (`keys`), fetched (`source`), or neither (unsigned requests: public
// buckets). botocore's order: an assumed role (role_arn with source_profile
// or credential_source: STS AssumeRole signed with the source's keys, which
// may themselves be an assumed role); a web identity (AWS_WEB_IDENTITY_TOKEN_FILE
// and AWS_ROLE_ARN, or the profile's web_identity_token_file and role_arn)
// through STS's AssumeRoleWithWebIdentity; an SSO role (sso_account_id and
// sso_role_name; the portal from the [sso-session] named or the profile),
// fetched with the token `aws sso login` cached (an sso-session token within
// 15 minutes of expiring refreshed first with SSO-OIDC CreateToken and
// written back to the cache, as botocore does); the profile's own keys;
// `credential_process`; the container endpoint
// (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI,
// AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]); else the instance metadata
// service unless AWS_EC2_METADATA_DISABLED=true
// (AWS_EC2_METADATA_SERVICE_ENDPOINT overrides its address). STS, the SSO
// portal and SSO-OIDC are AWS_ENDPOINT_URL_STS, _SSO, _SSO_OIDC, else
// AWS_ENDPOINT_URL, else the region's. A profile
// whose settings contradict each other (both source_profile and
// credential_source, a loop of source profiles, an MFA serial, which needs
// a code typed in) is an Error of kind InvalidArgument naming it.
struct ProfileCredentials {
  S3Credentials keys;
  std::shared_ptr<CredentialSource> source;
};
ProfileCredentials profile_credentials(const std::string& profile, const std::string& region);

// A command line split as Python's shlex.split splits it (botocore runs
// credential_process that way, without a shell). Exposed for tests.
std::vector<std::string> split_command_line(const std::string& line);

// "2026-12-05T12:00:00Z" (also with fractional seconds, "+00:00" or "UTC", as
// older AWS CLIs wrote SSO tokens' expiresAt) as a
// time; nullopt when it is not one.
std::optional<std::chrono::system_clock::time_point> parse_iso8601_utc(const std::string& text);
// "2026-12-05T12:00:00Z": the form botocore writes an SSO token's expiresAt in
// (whole seconds, UTC).
std::string format_iso8601_utc(std::chrono::system_clock::time_point t);

}  // namespace ckpt
