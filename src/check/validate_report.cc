// validate's output: JSON (docs/schema/validate.schema.json, documented in
// docs/json-schema.md) and a plain-text report for people.
#include <iomanip>

#include "check/validate.h"
#include "core/units.h"
#include "model/describe.h"

namespace ckpt::check {
namespace {

using Json = nlohmann::ordered_json;

Json or_null(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }
Json or_null(int v) { return v < 0 ? Json(nullptr) : Json(v); }

const char* status_of(const ValidateReport& r) {
  switch (r.exit_code()) {
    case 0: return "valid";
    case 1: return "problems";
    default:
      for (const auto& p : r.problems)
        if (p.code == ErrorCode::kUnsafe) return "unsafe";
      return "unreadable";
  }
}

}  // namespace

Json report_to_json(const ValidateReport& r) {
  Json j;
  j["schema_version"] = kValidateSchemaVersion;
  j["command"] = "validate";
  j["source"] = r.source;
  j["checkpoint"] = r.checkpoint.empty() ? r.source : r.checkpoint;
  j["format"] = or_null(r.format);
  j["world_size"] = or_null(r.world_size);
  j["status"] = status_of(r);
  j["exit_code"] = r.exit_code();
  j["summary"] = {
      {"files", r.files}, {"tensors", r.tensors}, {"tensor_bytes", r.tensor_bytes}, {"problems", r.problems.size()}};
  if (r.files_missing) j["summary"]["files_missing"] = r.files_missing;
  if (r.tensors_unread) j["summary"]["tensors_unread"] = r.tensors_unread;
  j["checks"] = r.checks;
  Json problems = Json::array();
  for (const auto& p : r.problems)
    problems.push_back({{"code", error_code_name(p.code)},
                        {"message", p.message},
                        {"file", or_null(p.file)},
                        {"rank", or_null(p.rank)},
                        {"key", or_null(p.tensor)},
                        {"kind", or_null(p.kind)}});
  j["problems"] = problems;
  j["notes"] = r.notes;
  if (r.finite_ran) {
    Json nonfinite = Json::array();
    for (const auto& n : r.nonfinite)
      nonfinite.push_back({{"key", n.key},
                           {"dtype", dtype_name(n.dtype)},
                           {"elements", n.elements},
                           {"nan", n.counts.nan},
                           {"inf", n.counts.inf}});
    j["finite"] = {{"device", r.finite_device}, {"tensors_scanned", r.finite_tensors}, {"nonfinite", nonfinite}};
  } else {
    j["finite"] = nullptr;
  }
  if (!r.manifest_algorithm.empty()) {
    Json m = {{"algorithm", r.manifest_algorithm},
              {"written", or_null(r.manifest_written)},
              {"verified", or_null(r.manifest_verified)}};
    if (r.manifest_comparison) {
      m["files_compared"] = r.manifest_comparison->files_compared;
      m["changed"] = r.manifest_comparison->changed;
      m["missing"] = r.manifest_comparison->missing;
      m["new"] = r.manifest_comparison->added;
    }
    j["manifest"] = m;
  } else {
    j["manifest"] = nullptr;
  }
  return j;
}

void print_report(const ValidateReport& r, std::ostream& out) {
  out << r.source;
  if (!r.checkpoint.empty() && r.checkpoint != r.source) out << " (checkpoint " << r.checkpoint << ")";
  out << ": " << (r.format.empty() ? "unreadable" : r.format);
  if (r.world_size > 0) out << ", world size " << r.world_size;
  out << ", " << r.files << " files";
  if (r.files_missing) out << " (" << r.files_missing << " missing)";
  out << ", " << r.tensors << " tensors (" << human_bytes(r.tensor_bytes);
  if (r.tensors_unread) out << "; " << r.tensors_unread << " not read: chunks in the missing files";
  out << ")\n";
  out << "checks: ";
  for (std::size_t i = 0; i < r.checks.size(); ++i) out << (i ? ", " : "") << r.checks[i];
  out << "\n";
  if (r.finite_ran) {
    out << "finite scan (" << r.finite_device << "): " << r.finite_tensors << " tensors, " << r.nonfinite.size()
        << " with NaN/Inf\n";
    for (const auto& n : r.nonfinite)
      out << "  " << std::left << std::setw(48) << n.key << " " << std::setw(9) << dtype_name(n.dtype) << " nan "
          << n.counts.nan << ", inf " << n.counts.inf << " of " << n.elements << "\n";
  }
  if (!r.manifest_written.empty())
    out << "manifest written: " << r.manifest_written << " (" << r.manifest_algorithm << ")\n";
  if (r.manifest_comparison)
    out << "manifest " << r.manifest_verified << ": " << r.manifest_comparison->changed << " changed, "
        << r.manifest_comparison->missing << " missing, " << r.manifest_comparison->added << " new\n";
  for (const auto& n : r.notes) out << "note: " << n << "\n";
  for (std::size_t i = 0; i < r.problems.size(); ++i) {
    const Problem& p = r.problems[i];
    out << "problem " << (i + 1) << " [" << (p.kind.empty() ? error_code_name(p.code) : p.kind.c_str())
        << "]: " << p.message << "\n";
    std::string where;
    if (!p.file.empty()) where += "file " + p.file;
    if (p.rank >= 0) where += std::string(where.empty() ? "" : ", ") + "rank " + std::to_string(p.rank);
    if (!p.tensor.empty()) where += std::string(where.empty() ? "" : ", ") + "key " + p.tensor;
    if (!where.empty()) out << "    (" << where << ")\n";
  }
  switch (r.exit_code()) {
    case 0: out << "VALID\n"; break;
    case 1: out << "INVALID: " << r.problems.size() << " problem" << (r.problems.size() == 1 ? "" : "s") << "\n"; break;
    default:
      out << (std::string(status_of(r)) == "unsafe" ? "UNSAFE: " : "UNREADABLE: ") << r.problems.size() << " problem"
          << (r.problems.size() == 1 ? "" : "s") << "\n";
      break;
  }
}

}  // namespace ckpt::check
