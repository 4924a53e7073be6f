#include "pickle/encodings.h"

#include <charconv>
#include <vector>

#include "core/error.h"

namespace ckpt::pickle {
namespace {

using Limbs = std::vector<uint32_t>;  // little-endian base 2^32 magnitude

void multiply_add(Limbs& mag, uint32_t factor, uint32_t addend) {
  uint64_t carry = addend;
  for (uint32_t& limb : mag) {
    uint64_t v = uint64_t{limb} * factor + carry;
    limb = static_cast<uint32_t>(v);
    carry = v >> 32;
  }
  if (carry != 0) mag.push_back(static_cast<uint32_t>(carry));
}

// Divides in place, returns the remainder.
uint32_t divide(Limbs& mag, uint32_t divisor) {
  uint64_t rem = 0;
  for (std::size_t i = mag.size(); i-- > 0;) {
    uint64_t cur = (rem << 32) | mag[i];
    mag[i] = static_cast<uint32_t>(cur / divisor);
    rem = cur % divisor;
  }
  while (!mag.empty() && mag.back() == 0) mag.pop_back();
  return static_cast<uint32_t>(rem);
}

// Drops sign-extension bytes that do not change the value.
void trim_twos_complement(std::string& le) {
  while (le.size() > 1) {
    auto last = static_cast<uint8_t>(le[le.size() - 1]);
    auto prev = static_cast<uint8_t>(le[le.size() - 2]);
    bool redundant = (last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80));
    if (!redundant) break;
    le.pop_back();
  }
  if (le.size() == 1 && le[0] == 0) le.clear();
}

// Magnitude bytes (little-endian) -> two's complement with the given sign.
std::string sign_magnitude_to_twos(std::string mag, bool negative) {
  mag.push_back('\0');  // room for the sign bit
  if (negative) {
    bool carry = true;
    for (char& c : mag) {
      unsigned v = static_cast<uint8_t>(~static_cast<uint8_t>(c)) + (carry ? 1u : 0u);
      c = static_cast<char>(v & 0xff);
      carry = v > 0xff;
    }
  }
  trim_twos_complement(mag);
  return mag;
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
unsigned hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return c - 'A' + 10;
}

// Decodes one UTF-8 sequence at text[i]; returns its length, 0 if invalid.
std::size_t decode_utf8_at(std::string_view text, std::size_t i, uint32_t* cp) {
  auto b0 = static_cast<uint8_t>(text[i]);
  std::size_t len;
  uint32_t v;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  } else if ((b0 & 0xe0) == 0xc0) {
    len = 2, v = b0 & 0x1f;
  } else if ((b0 & 0xf0) == 0xe0) {
    len = 3, v = b0 & 0x0f;
  } else if ((b0 & 0xf8) == 0xf0) {
    len = 4, v = b0 & 0x07;
  } else {
    return 0;
  }
  if (text.size() - i < len) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    auto b = static_cast<uint8_t>(text[i + k]);
    if ((b & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3f);
  }
  static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMinForLength[len] || v > 0x10ffff) return 0;
  *cp = v;
  return len;
}

}  // namespace

std::string decimal_to_twos_complement(std::string_view text) {
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) fail_data_loss("empty integer literal");
  if (text.size() > kMaxDecimalDigits) {
    fail_data_loss("integer literal of " + std::to_string(text.size()) + " digits exceeds the limit of " +
                   std::to_string(kMaxDecimalDigits));
  }
  Limbs mag;
  for (char c : text) {
    if (c < '0' || c > '9') fail_data_loss("integer literal has a non-digit character");
    multiply_add(mag, 10, static_cast<uint32_t>(c - '0'));
  }
  std::string bytes;
  for (uint32_t limb : mag) {
    for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<char>((limb >> (8 * k)) & 0xff));
  }
  return sign_magnitude_to_twos(std::move(bytes), negative);
}

std::optional<int64_t> twos_complement_to_int64(std::string_view le) {
  if (le.empty()) return 0;
  bool negative = static_cast<uint8_t>(le.back()) & 0x80;
  uint8_t fill = negative ? 0xff : 0x00;
  for (std::size_t i = 8; i < le.size(); ++i) {
    if (static_cast<uint8_t>(le[i]) != fill) return std::nullopt;
  }
  if (le.size() > 8 && ((static_cast<uint8_t>(le[7]) & 0x80) != 0) != negative) return std::nullopt;
  uint64_t v = negative ? ~uint64_t{0} : 0;
  std::size_t n = le.size() < 8 ? le.size() : 8;
  for (std::size_t i = 0; i < n; ++i) {
    v &= ~(uint64_t{0xff} << (8 * i));
    v |= uint64_t{static_cast<uint8_t>(le[i])} << (8 * i);
  }
  return static_cast<int64_t>(v);
}

std::string int64_to_twos_complement(int64_t v) {
  std::string le(8, '\0');
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) le[i] = static_cast<char>((u >> (8 * i)) & 0xff);
  trim_twos_complement(le);
  return le;
}

std::string twos_complement_to_decimal(std::string_view le) {
  bool negative = !le.empty() && (static_cast<uint8_t>(le.back()) & 0x80);
  std::string mag(le);
  if (negative) {  // magnitude = ~x + 1
    bool carry = true;
    for (char& c : mag) {
      unsigned v = static_cast<uint8_t>(~static_cast<uint8_t>(c)) + (carry ? 1u : 0u);
      c = static_cast<char>(v & 0xff);
      carry = v > 0xff;
    }
  }
  Limbs limbs((mag.size() + 3) / 4, 0);
  for (std::size_t i = 0; i < mag.size(); ++i) limbs[i / 4] |= uint32_t{static_cast<uint8_t>(mag[i])} << (8 * (i % 4));
  while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
  if (limbs.empty()) return "0";
  std::string digits;
  while (!limbs.empty()) {
    uint32_t chunk = divide(limbs, 1000000000u);
    for (int k = 0; k < 9; ++k) {
      digits.push_back(static_cast<char>('0' + chunk % 10));
      chunk /= 10;
    }
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (negative) digits.push_back('-');
  return std::string(digits.rbegin(), digits.rend());
}

uint64_t parse_memo_index(std::string_view text) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    fail_data_loss("memo index '" + std::string(text.substr(0, 32)) + "' is not a decimal number");
  }
  return v;
}

double parse_float_text(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t' || text.front() == '\r')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) text.remove_suffix(1);
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool out_of_range = ec == std::errc::result_out_of_range;  // Python rounds to inf/0 too
  if (text.empty() || (ec != std::errc() && !out_of_range) || end != text.data() + text.size()) {
    fail_data_loss("float literal '" + std::string(text.substr(0, 32)) + "' is not a number");
  }
  return v;
}

std::string escape_decode(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (std::size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (++i == body.size()) fail_data_loss("string literal ends with a lone backslash");
    c = body[i];
    switch (c) {
      case '\n': break;  // line continuation
      case '\\':
      case '\'':
      case '"': out.push_back(c); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x':
        if (i + 2 >= body.size() || !is_hex(body[i + 1]) || !is_hex(body[i + 2])) {
          fail_data_loss("invalid \\x escape in string literal");
        }
        out.push_back(static_cast<char>(hex_value(body[i + 1]) * 16 + hex_value(body[i + 2])));
        i += 2;
        break;
      default:
        if (c >= '0' && c <= '7') {
          unsigned v = c - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            v = v * 8 + (body[++i] - '0');
          }
          out.push_back(static_cast<char>(v & 0xff));
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

std::string raw_unicode_escape_to_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    auto c = static_cast<uint8_t>(text[i]);
    bool escape = c == '\\' && i + 1 < text.size() && (text[i + 1] == 'u' || text[i + 1] == 'U');
    if (!escape) {
      if (c == '\\' && i + 1 < text.size()) {  // "\\x" is two characters; skip the pair
        append_utf8(out, c);
        append_utf8(out, static_cast<uint8_t>(text[++i]));
      } else {
        append_utf8(out, c);
      }
      continue;
    }
    std::size_t digits = text[i + 1] == 'u' ? 4 : 8;
    if (text.size() - (i + 2) < digits) fail_data_loss("truncated \\u escape in unicode literal");
    uint32_t cp = 0;
    for (std::size_t k = 0; k < digits; ++k) {
      char h = text[i + 2 + k];
      if (!is_hex(h)) fail_data_loss("invalid \\u escape in unicode literal");
      cp = cp * 16 + hex_value(h);
    }
    if (cp > 0x10ffff) fail_data_loss("\\U escape beyond U+10FFFF in unicode literal");
    append_utf8(out, cp);
    i += 1 + digits;
  }
  return out;
}

std::string latin1_to_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (char c : bytes) append_utf8(out, static_cast<uint8_t>(c));
  return out;
}

std::string utf8_to_latin1(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    std::size_t len = decode_utf8_at(text, i, &cp);
    if (len == 0) fail_data_loss("string is not valid UTF-8");
    if (cp > 0xff) fail_data_loss("latin-1 string has a code point beyond U+00FF");
    out.push_back(static_cast<char>(cp));
    i += len;
  }
  return out;
}

bool is_valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    std::size_t len = decode_utf8_at(text, i, &cp);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

}  // namespace ckpt::pickle
