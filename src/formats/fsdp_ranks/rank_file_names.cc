#include "formats/fsdp_ranks/rank_file_names.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "core/error.h"
#include "core/log.h"
#include "io/containment.h"

namespace ckpt::fsdp_ranks {
namespace {

namespace fs = std::filesystem;

bool has_extension(const std::string& name) {
  static const std::regex kExt(R"(.*\.(pt|pth|bin))");
  return std::regex_match(name, kExt);
}

std::string kind_of(const std::string& tmpl) {
  if (tmpl.find("optim") != std::string::npos) return "optim";
  if (tmpl.find("model") != std::string::npos) return "model";
  return "";
}

int parse_int(const std::string& digits) {
  if (digits.size() > 6) return -1;  // no world has a million ranks; keeps stoi in range
  return std::stoi(digits);
}

}  // namespace

std::string RankFileName::name_for(int r) const {
  std::string out = tmpl;
  if (auto at = out.find("{r}"); at != std::string::npos) out.replace(at, 3, std::to_string(r));
  if (auto at = out.find("{N}"); at != std::string::npos && world_size >= 0)
    out.replace(at, 3, std::to_string(world_size));
  return out;
}

std::optional<RankFileName> parse_rank_file_name(const std::string& filename) {
  if (!has_extension(filename)) return std::nullopt;
  static const std::regex kVerl(R"(^(.*)_world_size_(\d+)_rank_(\d+)(\.[A-Za-z]+)$)");
  static const std::regex kGeneric(R"(^(.*?rank[_-]?)(\d+)(.*)$)", std::regex::icase);
  std::smatch m;
  RankFileName out;
  if (std::regex_match(filename, m, kVerl)) {
    out.world_size = parse_int(m[2].str());
    out.rank = parse_int(m[3].str());
    out.tmpl = m[1].str() + "_world_size_{N}_rank_{r}" + m[4].str();
    out.auxiliary = m[1].str() == "extra_state";
  } else if (std::regex_match(filename, m, kGeneric)) {
    out.rank = parse_int(m[2].str());
    out.tmpl = m[1].str() + "{r}" + m[3].str();
  } else {
    return std::nullopt;
  }
  if (out.rank < 0) return std::nullopt;
  out.kind = kind_of(out.tmpl);
  return out;
}

bool is_glob_pattern(const std::string& src) { return src.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> list_rank_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    auto name = parse_rank_file_name(entry.path().filename().string());
    if (name && !name->auxiliary) {
      require_inside(entry.path().string(), dir);
      out.push_back(entry.path().string());
    } else {
      log::debug("ignoring " + entry.path().string() +
                 (name ? ": not a state dict (veRL extra state)" : ": no rank in its file name"));
    }
  }
  if (ec) fail(ErrorCode::kNotFound, dir + ": cannot list directory: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  // No GLOB_ERR: a directory in the pattern that does not exist is a
  // pattern matching nothing, the user's mistake, not a read error.
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty())) fail_invalid(pattern + ": no file matches this pattern");
  if (rc != 0) fail(ErrorCode::kNotFound, pattern + ": cannot expand this pattern");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ckpt::fsdp_ranks
