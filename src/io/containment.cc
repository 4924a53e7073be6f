#include "io/containment.h"

#include <algorithm>
#include <filesystem>

#include "core/budgets.h"
#include "core/error.h"

namespace ckpt {

namespace fs = std::filesystem;

void require_inside(const std::string& path, const std::string& dir) {
  if (input_budgets().follow_links) return;
  std::error_code ec;
  fs::path target = fs::canonical(path, ec);
  if (ec) return;  // missing: the open names it
  fs::path root = fs::canonical(dir, ec);
  if (ec) return;
  auto [r, t] = std::mismatch(root.begin(), root.end(), target.begin(), target.end());
  if (r == root.end()) return;
  fail(ErrorCode::kUnsafe, path + " resolves to " + target.string() + ", outside the checkpoint directory " +
                               root.string() + "; refused (--follow-links reads it, for trusted input)");
}

}  // namespace ckpt
