#include "io/aws_credentials.h"

#include <catch2/catch.hpp>

#include "core/error.h"

using namespace ckpt;

TEST_CASE("credential_process lines split as shlex.split splits them", "[io]") {
  using V = std::vector<std::string>;
  CHECK(split_command_line("aws-vault exec ml --json") == V{"aws-vault", "exec", "ml", "--json"});
  CHECK(split_command_line("  /opt/a\\ b/helper 'one two' \"x \\\"y\\\" \\$z\"  ") ==
        V{"/opt/a b/helper", "one two", "x \"y\" \\$z"});
  CHECK(split_command_line("a''b \"\"") == V{"ab", ""});
  CHECK_THROWS_AS(split_command_line("helper 'open"), Error);
  CHECK(split_command_line("").empty());
}

TEST_CASE("ISO 8601 UTC times as the credential endpoints write them", "[io]") {
  auto t = parse_iso8601_utc("2026-12-05T12:00:00Z");
  REQUIRE(t);
  CHECK(std::chrono::system_clock::to_time_t(*t) == 1796472000);
  CHECK(parse_iso8601_utc("2026-12-05T12:00:00.123Z") == t);
  CHECK(parse_iso8601_utc("2026-12-05T12:00:00+00:00") == t);
  CHECK(!parse_iso8601_utc("2026-12-05T12:00:00+02:00"));
  CHECK(!parse_iso8601_utc("tomorrow"));
  // The form botocore writes a refreshed SSO token's expiresAt in (whole seconds).
  CHECK(format_iso8601_utc(*t + std::chrono::milliseconds(999)) == "2026-12-05T12:00:00Z");
  CHECK(format_iso8601_utc(*t + std::chrono::hours(8)) == "2026-12-05T20:00:00Z");
}
