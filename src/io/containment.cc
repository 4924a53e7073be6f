#include "io/containment.h"

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>
#include <vector>

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

namespace {

// A path as a comparable absolute, lexically normal form (no file system
// access: symlinks are what the check resolves, not what names a path).
fs::path lexical(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) p = path;
  p = p.lexically_normal();
  if (!p.empty() && p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  return p;
}

bool is_under(const fs::path& root, const fs::path& p) {
  auto [r, t] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
  return r == root.end();
}

struct Registry {
  std::mutex mutex;
  std::vector<fs::path> roots;  // lexical
  std::set<fs::path> trusted;   // lexical
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void add_checkpoint_root(const std::string& dir) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  fs::path root = lexical(dir);
  if (std::find(r.roots.begin(), r.roots.end(), root) == r.roots.end()) r.roots.push_back(root);
}

void trust_given_path(const std::string& path) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.trusted.insert(lexical(path));
}

void require_contained(const std::string& path) {
  if (input_budgets().follow_links) return;
  const fs::path p = lexical(path);
  std::vector<fs::path> roots;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (r.trusted.count(p)) return;
    for (const auto& root : r.roots)
      if (is_under(root, p)) roots.push_back(root);
  }
  for (const auto& root : roots) require_inside(path, root.string());
}

}  // namespace ckpt
