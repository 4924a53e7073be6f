#include "formats/rank_file_names.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/linear_regex.h"
#include "core/log.h"
#include "io/containment.h"
#include "io/storage.h"

namespace ckpt::fsdp_ranks {
namespace {

namespace fs = std::filesystem;

bool has_extension(const std::string& name) {
  static const LinearRegex kExt = LinearRegex::compile(R"(.*\.(pt|pth|bin))");
  return kExt.match(name);
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
  std::string number = std::to_string(r);
  if (number.size() < static_cast<std::size_t>(digits)) number.insert(0, digits - number.size(), '0');
  if (auto at = out.find("{r}"); at != std::string::npos) out.replace(at, 3, number);
  if (auto at = out.find("{N}"); at != std::string::npos && world_size >= 0)
    out.replace(at, 3, std::to_string(world_size));
  return out;
}

std::optional<RankFileName> parse_rank_file_name(const std::string& filename) {
  if (!has_extension(filename)) return std::nullopt;
  static const LinearRegex kVerl = LinearRegex::compile(R"(^(.*)_world_size_(\d+)_rank_(\d+)(\.[A-Za-z]+)$)");
  static const LinearRegex kGeneric = LinearRegex::compile(R"(^(.*?rank[_-]?)(\d+)(.*)$)", LinearRegex::kIcase);
  RegexMatch m;
  RankFileName out;
  if (kVerl.match(filename, m)) {
    out.world_size = parse_int(m.str(2));
    out.rank = parse_int(m.str(3));
    out.tmpl = m.str(1) + "_world_size_{N}_rank_{r}" + m.str(4);
    out.auxiliary = m[1] == "extra_state";
  } else if (kGeneric.match(filename, m)) {
    out.rank = parse_int(m.str(2));
    out.tmpl = m.str(1) + "{r}" + m.str(3);
  } else {
    return std::nullopt;
  }
  if (out.rank < 0) return std::nullopt;
  out.kind = kind_of(out.tmpl);
  return out;
}

RankFileName name_from_template(const std::string& tmpl) {
  RankFileName out;
  out.tmpl = tmpl;
  out.kind = kind_of(tmpl);
  return out;
}

namespace {

// One way to read a name as a member of a numbered family: the name with
// one of its digit runs replaced by {r}, and that run's value.
struct Numbered {
  std::string tmpl;
  int rank = -1;
  int digits = 0;
};

std::vector<Numbered> numbered_readings(const std::string& name) {
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  std::vector<Numbered> out;
  if (!has_extension(name)) return out;
  for (std::size_t at = 0, end = 0; at < name.size(); at = end) {  // each run of digits
    if (!is_digit(name[at])) {
      end = at + 1;
      continue;
    }
    for (end = at; end < name.size() && is_digit(name[end]);) ++end;
    const std::string run = name.substr(at, end - at);
    int value = parse_int(run);
    if (value < 0) continue;
    out.push_back({name.substr(0, at) + "{r}" + name.substr(at + run.size()), value,
                   run.size() > 1 && run[0] == '0' ? static_cast<int>(run.size()) : 0});
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, RankFileName>> name_rank_files(const std::vector<std::string>& paths,
                                                                  std::vector<std::string>* unnamed) {
  std::vector<std::pair<std::string, RankFileName>> out;
  std::vector<std::string> rest;
  for (const auto& path : paths) {
    if (auto name = parse_rank_file_name(fs::path(path).filename().string()))
      out.emplace_back(path, *name);
    else
      rest.push_back(path);
  }
  // Numbered families, the largest first; each file joins at most one.
  std::map<std::string, std::vector<std::pair<std::size_t, Numbered>>> by_template;
  for (std::size_t i = 0; i < rest.size(); ++i)
    for (const Numbered& n : numbered_readings(fs::path(rest[i]).filename().string()))
      by_template[n.tmpl].emplace_back(i, n);
  std::vector<const std::pair<const std::string, std::vector<std::pair<std::size_t, Numbered>>>*> order;
  for (const auto& entry : by_template) order.push_back(&entry);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto* a, const auto* b) { return a->second.size() > b->second.size(); });
  std::vector<bool> taken(rest.size(), false);
  for (const auto* entry : order) {
    const auto& members = entry->second;
    std::set<int> ranks;
    bool free = true;
    for (const auto& [i, n] : members) {
      ranks.insert(n.rank);
      free = free && !taken[i];
    }
    const auto count = static_cast<int>(members.size());
    if (!free || count < 2 || static_cast<int>(ranks.size()) != count || !ranks.count(0) ||
        *ranks.rbegin() >= 2 * count)
      continue;
    for (const auto& [i, n] : members) {
      taken[i] = true;
      RankFileName name = name_from_template(n.tmpl);
      name.rank = n.rank;
      name.digits = n.digits;
      out.emplace_back(rest[i], name);
    }
  }
  if (unnamed)
    for (std::size_t i = 0; i < rest.size(); ++i)
      if (!taken[i]) unnamed->push_back(rest[i]);
  return out;
}

bool is_glob_pattern(const std::string& src) { return src.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> list_rank_files(const std::string& dir) {
  std::vector<std::string> files, unnamed, out;
  const EntryStat st = stat_path(dir);
  if (!st.is_directory())
    fail(ErrorCode::kNotFound,
         dir + ": cannot list directory: " + (st.exists() ? "Not a directory" : "No such file or directory"));
  for (const DirEntry& entry : list_directory(dir))
    if (entry.is_file()) files.push_back(entry.path);
  for (const auto& [path, name] : name_rank_files(files, &unnamed)) {
    if (name.auxiliary) {
      log::debug("ignoring " + path + ": not a state dict (veRL extra state)");
      continue;
    }
    require_inside(path, dir);
    out.push_back(path);
  }
  for (const auto& path : unnamed) log::debug("ignoring " + path + ": no rank in its file name");
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
