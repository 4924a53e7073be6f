#include "io/aws_text.h"

#include <cctype>
#include <cstdlib>

namespace ckpt {

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::string uri_encode(const std::string& s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::optional<std::string> xml_element(const std::string& xml, const std::string& tag, std::size_t from,
                                       std::size_t* end) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  const auto b = xml.find(open, from);
  if (b == std::string::npos) return std::nullopt;
  const auto e = xml.find(close, b + open.size());
  if (e == std::string::npos) return std::nullopt;
  if (end) *end = e + close.size();
  std::string raw = xml.substr(b + open.size(), e - b - open.size()), out;
  // The five predefined entities and numeric references, which keys may hold.
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    const auto semi = raw.find(';', i);
    const std::string ent = semi == std::string::npos ? "" : raw.substr(i + 1, semi - i - 1);
    if (ent == "amp")
      out += '&';
    else if (ent == "lt")
      out += '<';
    else if (ent == "gt")
      out += '>';
    else if (ent == "quot")
      out += '"';
    else if (ent == "apos")
      out += '\'';
    else if (ent.size() > 1 && ent[0] == '#') {
      unsigned long cp =
          ent[1] == 'x' ? std::strtoul(ent.c_str() + 2, nullptr, 16) : std::strtoul(ent.c_str() + 1, nullptr, 10);
      if (cp < 0x80)
        out += static_cast<char>(cp);
      else if (cp < 0x800)
        out += {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      else
        out += {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                static_cast<char>(0x80 | (cp & 0x3F))};
    } else {
      out += '&';
      continue;
    }
    i = semi;
  }
  return out;
}

}  // namespace ckpt
