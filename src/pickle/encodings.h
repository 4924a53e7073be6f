// The text and integer encodings pickle borrows from Python: decimal ints of
// any size, float reprs, Python 2 string-literal escapes, raw-unicode-escape,
// UTF-8 with surrogates allowed ("surrogatepass"), and the minimal
// little-endian two's complement that LONG1/LONG4 carry. Every function
// throws DataLoss (without location; the unpickler adds it) on bad input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ckpt::pickle {

// Python refuses int/str conversions beyond this many digits by default
// (sys.int_info.default_max_str_digits); so do we.
inline constexpr std::size_t kMaxDecimalDigits = 4300;

// "[-+]?[0-9]+" -> little-endian two's complement, minimal as CPython's
// pickle.encode_long writes it ("" for zero).
std::string decimal_to_twos_complement(std::string_view text);
// The value of `le` when it fits in int64 ("" is 0).
std::optional<int64_t> twos_complement_to_int64(std::string_view le);
// CPython's pickle.encode_long for a value that fits in int64.
std::string int64_to_twos_complement(int64_t v);
// Decimal rendering of a little-endian two's complement integer.
std::string twos_complement_to_decimal(std::string_view le);

// Unsigned decimal memo index of GET/PUT lines.
uint64_t parse_memo_index(std::string_view text);
// A float repr: "1.5", "-inf", "nan", "1e+300".
double parse_float_text(std::string_view text);

// codecs.escape_decode: the body of a quoted Python 2 str literal.
std::string escape_decode(std::string_view body);
// raw-unicode-escape (only \uXXXX and \UXXXXXXXX are escapes) -> UTF-8.
std::string raw_unicode_escape_to_utf8(std::string_view text);
// Latin-1 bytes -> UTF-8, and back (DataLoss if a code point is >= 256).
std::string latin1_to_utf8(std::string_view bytes);
std::string utf8_to_latin1(std::string_view text);

// UTF-8, allowing encoded surrogates as CPython's "surrogatepass" does.
bool is_valid_utf8(std::string_view text);
void append_utf8(std::string& out, uint32_t code_point);

}  // namespace ckpt::pickle
