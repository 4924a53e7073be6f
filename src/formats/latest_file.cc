#include "formats/latest_file.h"

#include <fstream>
#include <iterator>

#include "core/error.h"

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

std::optional<std::string> read_latest_tag(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  // One byte past what a tag and its line end can take: enough to tell.
  std::string text(kMaxTag + 3, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  std::string tag = text.substr(0, text.find('\n'));
  while (!tag.empty() && (tag.back() == '\r' || tag.back() == ' ' || tag.back() == '\t')) tag.pop_back();
  const std::string name = file.string();
  if (tag.size() > kMaxTag)
    fail_data_loss(name + ": holds " + excerpt(tag) + ", longer than a directory name can be; not a tag");
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos ||
      tag.find('\0') != std::string::npos)
    fail_data_loss(name + ": names " + excerpt(tag) + ", which is not a directory inside " +
                   file.parent_path().string());
  return tag;
}

}  // namespace ckpt
