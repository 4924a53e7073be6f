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
  // DeepSpeed reads the whole file and strips it (`fd.read().strip()`), so
  // whitespace around the name goes and a line break inside it stays. 4 KiB
  // tell a tag from anything else (a tag is at most 255 bytes).
  constexpr std::size_t kRead = 4096;
  std::string text = in->read_string(0, static_cast<std::size_t>(std::min<uint64_t>(in->size(), kRead)));
  const char* kSpace = " \t\n\v\f\r\x1c\x1d\x1e\x1f";  // str.strip()'s ASCII whitespace
  const std::size_t first = text.find_first_not_of(kSpace);
  std::string tag = first == std::string::npos ? "" : text.substr(first, text.find_last_not_of(kSpace) - first + 1);
  const std::string& name = path;
  // A byte-order mark is no whitespace to str.strip(): it stays in the name
  // ('\ufeffglobal_step5'), which is no folder.
  if (tag.rfind("\xEF\xBB\xBF", 0) == 0)
    fail_data_loss(name + ": starts with a UTF-8 byte-order mark, which DeepSpeed reads as part of the tag name " +
                   excerpt(tag) + "; no folder has that name");
  if (tag.size() > kMaxTag)
    fail_data_loss(name + ": holds " + excerpt(tag) + ", longer than a directory name can be; not a tag");
  if (tag.find_first_of("\n\r") != std::string::npos)
    fail_data_loss(name + ": holds more than one line (" + excerpt(tag) + "); DeepSpeed reads it all as one tag name");
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos ||
      tag.find('\0') != std::string::npos)
    fail_data_loss(name + ": names " + excerpt(tag) + ", which is not a directory inside " + parent_dir(path));
  return tag;
}

}  // namespace ckpt
