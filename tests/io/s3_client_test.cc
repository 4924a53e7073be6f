#include <catch2/catch.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/s3_client.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"
#include "io/storage.h"

using namespace ckpt;
namespace fs = std::filesystem;

TEST_CASE("s3 URLs split into bucket and key, trailing slashes dropped", "[io][s3]") {
  CHECK(is_s3_url("s3://b/k"));
  CHECK_FALSE(is_s3_url("s3:/b/k"));
  CHECK_FALSE(is_s3_url("./s3://b"));
  S3Url u = parse_s3_url("s3://my-bucket/ckpt/step-100/");
  CHECK(u.bucket == "my-bucket");
  CHECK(u.key == "ckpt/step-100");
  CHECK(s3_url_string(u) == "s3://my-bucket/ckpt/step-100");
  CHECK(parse_s3_url("s3://my-bucket").key.empty());
  CHECK(s3_url_string(parse_s3_url("s3://my-bucket/")) == "s3://my-bucket");
}

TEST_CASE("s3 URLs without a valid bucket are usage errors naming the path", "[io][s3]") {
  for (const char* bad : {"s3://", "s3:///key", "s3://ab/k", "s3://Upper/k", "s3://under_score/k", "s3://b.b//k"}) {
    try {
      parse_s3_url(bad);
      FAIL(bad);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kInvalidArgument);
      CHECK(std::string(e.what()).find(bad) != std::string::npos);
    }
  }
}

TEST_CASE("storage_for sends s3:// paths to the S3 backend, which has no local path", "[io][s3]") {
  CHECK_FALSE(storage_for("s3://bucket/a.pt").local_path("s3://bucket/a.pt"));
  CHECK(storage_for("s3://bucket/a/").resolved("s3://bucket/a/") == "s3://bucket/a");
  CHECK(storage_for("local/a.pt").local_path("local/a.pt") == "local/a.pt");
}

TEST_CASE("xml_element decodes entities and walks repeated elements", "[io][s3]") {
  const std::string xml =
      "<R><Contents><Key>a&amp;b&lt;c&#38;d&#x41;</Key></Contents><Contents><Key>two</Key></Contents></R>";
  std::size_t end = 0;
  auto first = xml_element(xml, "Contents", 0, &end);
  REQUIRE(first);
  CHECK(xml_element(*first, "Key") == "a&b<c&dA");
  auto second = xml_element(xml, "Contents", end, &end);
  REQUIRE(second);
  CHECK(xml_element(*second, "Key") == "two");
  CHECK_FALSE(xml_element(xml, "Contents", end));
  CHECK_FALSE(xml_element("<Code>unterminated", "Code"));
}

TEST_CASE("request URLs: path-style and virtual-hosted, keys and sorted query encoded", "[io][s3]") {
  S3Config c;
  c.endpoint = "http://127.0.0.1:9000";
  c.path_style = true;
  S3Request r;
  r.bucket = "bkt";
  r.key = "dir/a b+c.pt";
  r.query = {{"prefix", "x/y"}, {"list-type", "2"}};
  CHECK(S3Client(c).url_of(r) == "http://127.0.0.1:9000/bkt/dir/a%20b%2Bc.pt?list-type=2&prefix=x%2Fy");
  c.path_style = false;
  c.endpoint = "";
  c.region = "eu-west-1";
  r.query.clear();
  CHECK(S3Client(c).url_of(r) == "https://bkt.s3.eu-west-1.amazonaws.com/dir/a%20b%2Bc.pt");
}

namespace {
struct EnvGuard {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const std::string& name, const char* value) {
    const char* old = getenv(name.c_str());
    saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value)
      setenv(name.c_str(), value, 1);
    else
      unsetenv(name.c_str());
  }
  ~EnvGuard() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it)
      if (it->second)
        setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        unsetenv(it->first.c_str());
  }
};
}  // namespace

TEST_CASE("credentials and region come from the environment, else AWS_PROFILE's shared files", "[io][s3]") {
  fs::path dir = fs::temp_directory_path() / ("ckpt_s3_profile_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "credentials") << "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n"
                                     << "[train]\naws_access_key_id=TRAINKEY\naws_secret_access_key=trainsecret\n"
                                     << "aws_session_token = tok\n";
  std::ofstream(dir / "config") << "[default]\nregion = us-west-2\n[profile train]\nregion = eu-central-1\n";
  EnvGuard env;
  for (const char* name :
       {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "CKPTCONV_S3_ADDRESSING_STYLE"})
    env.set(name, nullptr);
  env.set("AWS_SHARED_CREDENTIALS_FILE", (dir / "credentials").c_str());
  env.set("AWS_CONFIG_FILE", (dir / "config").c_str());
  env.set("AWS_PROFILE", "train");
  S3Config c = s3_config_from_environment();
  CHECK(c.credentials.access_key_id == "TRAINKEY");
  CHECK(c.credentials.secret_access_key == "trainsecret");
  CHECK(c.credentials.session_token == "tok");
  CHECK(c.region == "eu-central-1");
  CHECK_FALSE(c.path_style);  // AWS itself: virtual-hosted

  env.set("AWS_PROFILE", nullptr);
  c = s3_config_from_environment();
  CHECK(c.credentials.access_key_id == "DEF");
  CHECK(c.region == "us-west-2");

  env.set("AWS_ACCESS_KEY_ID", "ENVKEY");
  env.set("AWS_SECRET_ACCESS_KEY", "envsecret");
  env.set("AWS_REGION", "ap-south-1");
  env.set("AWS_ENDPOINT_URL", "http://minio:9000/");
  c = s3_config_from_environment();
  CHECK(c.credentials.access_key_id == "ENVKEY");
  CHECK(c.region == "ap-south-1");
  CHECK(c.endpoint == "http://minio:9000");
  CHECK(c.path_style);  // a custom endpoint: path-style
  fs::remove_all(dir);
}

TEST_CASE("s3 part sizes are 8 MiB until an object needs more than 10,000 of them", "[io][s3]") {
  const uint64_t mib = 1u << 20;
  CHECK(s3_part_size(0) == 8 * mib);
  CHECK(s3_part_size(80000 * mib) == 8 * mib);  // exactly 10,000 parts of 8 MiB
  CHECK(s3_part_size(80000 * mib + 1) == 9 * mib);
  const uint64_t tib = mib * mib;
  const uint64_t part = s3_part_size(tib);  // 1 TiB: 105 MiB parts
  CHECK(part == 105 * mib);
  CHECK((tib + part - 1) / part <= kS3MaxParts);
  CHECK(part % mib == 0);
}
