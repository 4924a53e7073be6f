#include "core/units.h"

#include <cctype>
#include <cstdio>

#include "core/error.h"

namespace ckpt {

uint64_t parse_size(const std::string& text) {
  std::size_t i = 0;
  uint64_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (value > (UINT64_MAX - 9) / 10) fail_invalid("size '" + text + "' is too large");
    value = value * 10 + static_cast<uint64_t>(text[i++] - '0');
  }
  if (i == 0) fail_invalid("size '" + text + "' does not start with a number");
  std::string suffix = text.substr(i);
  for (auto& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  int shift = 0;
  if (suffix.empty() || suffix == "B")
    shift = 0;
  else if (suffix[0] == 'K')
    shift = 10;
  else if (suffix[0] == 'M')
    shift = 20;
  else if (suffix[0] == 'G')
    shift = 30;
  else if (suffix[0] == 'T')
    shift = 40;
  else
    fail_invalid("size '" + text + "' has an unknown unit (use K, M, G or T)");
  std::string rest = suffix.size() > 1 ? suffix.substr(1) : "";
  if (!(rest.empty() || rest == "B" || rest == "I" || rest == "IB"))
    fail_invalid("size '" + text + "' has an unknown unit");
  if (shift && value > (UINT64_MAX >> shift)) fail_invalid("size '" + text + "' is too large");
  return value << shift;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

}  // namespace ckpt
