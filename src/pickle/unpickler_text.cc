// Protocol-0 opcodes whose argument is a text line ending in '\n', parsed as
// CPython's Lib/pickle.py does (load_int, load_long, load_float, load_string,
// load_unicode, load_persid, load_get, load_put), with every length bounded
// by the line itself.
#include "core/error.h"
#include "pickle/encodings.h"
#include "pickle/unpickler_machine.h"

namespace ckpt::pickle {
namespace {

ValuePtr integer_from_decimal(std::string_view text) {
  std::string le = decimal_to_twos_complement(text);
  if (auto v = twos_complement_to_int64(le)) return Value::integer(*v);
  return Value::big_integer(std::move(le));
}

}  // namespace

// INT: decimal, or "00"/"01" for False/True (protocol 0 bools).
void PickleMachine::op_int() {
  std::string_view line = read_line();
  if (line == "00") {
    push_new(Value::boolean(false));
  } else if (line == "01") {
    push_new(Value::boolean(true));
  } else {
    push_new(integer_from_decimal(line));
  }
}

// LONG: decimal with Python 2's optional trailing 'L'.
void PickleMachine::op_long() {
  std::string_view line = read_line();
  if (!line.empty() && line.back() == 'L') line.remove_suffix(1);
  push_new(integer_from_decimal(line));
}

void PickleMachine::op_float() { push_new(Value::floating(parse_float_text(read_line()))); }

// STRING: a quoted Python 2 str literal with backslash escapes.
void PickleMachine::op_string() {
  std::string_view line = read_line();
  if (line.size() < 2 || line.front() != line.back() || (line.front() != '\'' && line.front() != '"')) {
    fail_data_loss("STRING argument is not a quoted literal");
  }
  std::string raw = escape_decode(line.substr(1, line.size() - 2));
  op_py2_string(raw);
}

// A Python 2 str has no encoding. torch.load decodes it as UTF-8; we do the
// same, and keep bytes that are not UTF-8 as kBytes instead of failing.
void PickleMachine::op_py2_string(std::string_view raw) {
  if (is_valid_utf8(raw)) {
    push_new(Value::str(std::string(raw)));
  } else {
    push_new(Value::bytes(std::string(raw)));
  }
}

// UNICODE: raw-unicode-escape text.
void PickleMachine::op_unicode() { push_new(Value::str(raw_unicode_escape_to_utf8(read_line()))); }

// PERSID: an ASCII persistent id.
void PickleMachine::op_persid() {
  std::string_view line = read_line();
  for (char c : line) {
    if (static_cast<unsigned char>(c) >= 0x80) fail_data_loss("PERSID argument is not ASCII");
  }
  ValuePtr pid = make(Value::str(std::string(line)));
  push_new(Value::persistent_id(std::move(pid)));
}

void PickleMachine::op_get() { memo_get(parse_memo_index(read_line())); }

void PickleMachine::op_put() { memo_put(parse_memo_index(read_line())); }

}  // namespace ckpt::pickle
