#include "io/disk_space.h"

#include <sys/statvfs.h>

#include <filesystem>

#include "io/s3_url.h"

namespace ckpt {

std::optional<uint64_t> free_bytes_at(const std::string& path) {
  namespace fs = std::filesystem;
  if (is_s3_url(path)) return std::nullopt;  // a bucket has no free space to run out of
  fs::path p = fs::absolute(path.empty() ? "." : path);
  std::error_code ec;
  while (!fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0) return std::nullopt;
  return static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
}

}  // namespace ckpt
