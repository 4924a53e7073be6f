#include "formats/latest_file.h"

#include <algorithm>

#include "core/error.h"
#include "core/paths.h"
#include "io/storage.h"

namespace ckpt {
namespace {

constexpr std::size_t kMaxTag = 255;  // NAME_MAX: no directory name is longer
constexpr std::size_t kShown = 64;    // what of a bad `latest` a message quotes

std::string excerpt(const std::string& text) {
  std::string shown;
  for (char c : text.substr(0, kShown)) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
  return "'" + shown + (text.size() > kShown ? "...'" : "'");
}

}  // namespace

std::optional<std::string> read_latest_tag(const std::string& path) {
  if (!is_regular_file(path)) return std::nullopt;
  SourcePtr in = open_file_source(path);
  // One byte past what a tag and its line end can take: enough to tell.
  std::string text = in->read_string(0, static_cast<std::size_t>(std::min<uint64_t>(in->size(), kMaxTag + 3)));
  std::string tag = text.substr(0, text.find('\n'));
  while (!tag.empty() && (tag.back() == '\r' || tag.back() == ' ' || tag.back() == '\t')) tag.pop_back();
  const std::string& name = path;
  if (tag.size() > kMaxTag)
    fail_data_loss(name + ": holds " + excerpt(tag) + ", longer than a directory name can be; not a tag");
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos ||
      tag.find('\0') != std::string::npos)
    fail_data_loss(name + ": names " + excerpt(tag) + ", which is not a directory inside " + parent_dir(path));
  return tag;
}

}  // namespace ckpt
