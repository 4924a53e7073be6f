#include "formats/safetensors/safetensors_format.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "core/error.h"
#include "model/ordered_json.h"

namespace ckpt::safetensors {
namespace {

struct CodeEntry {
  DType dtype;
  std::string_view code;
};

// In safetensors' Dtype enum order (the writer sorts by it, descending).
constexpr std::array<CodeEntry, 20> kCodes{{
    {DType::kBool, "BOOL"},
    {DType::kFloat4E2M1FNx2, "F4"},  // then F6_E2M3, F6_E3M2: no torch dtype (fp6_refusal)
    {DType::kUInt8, "U8"},
    {DType::kInt8, "I8"},
    {DType::kFloat8E5M2, "F8_E5M2"},
    {DType::kFloat8E4M3FN, "F8_E4M3"},
    {DType::kFloat8E8M0FNU, "F8_E8M0"},
    {DType::kFloat8E4M3FNUZ, "F8_E4M3FNUZ"},  // the order save_file writes them in, read off safetensors 0.8
    {DType::kFloat8E5M2FNUZ, "F8_E5M2FNUZ"},
    {DType::kInt16, "I16"},
    {DType::kUInt16, "U16"},
    {DType::kFloat16, "F16"},
    {DType::kBFloat16, "BF16"},
    {DType::kInt32, "I32"},
    {DType::kUInt32, "U32"},
    {DType::kFloat32, "F32"},
    {DType::kComplex64, "C64"},
    {DType::kFloat64, "F64"},
    {DType::kInt64, "I64"},
    {DType::kUInt64, "U64"},
}};

// safetensors' FP6 codes: torch has no dtype for them, so no torch reader
// (safe_open(..., "pt"), ckptconv) can load such a tensor.
std::optional<std::string> fp6_refusal(const std::string& code) {
  if (code != "F6_E2M3" && code != "F6_E3M2") return std::nullopt;
  return code +
         " (FP6) has no torch dtype; no torch reader can load it (safetensors' own \"pt\" loader refuses it "
         "too): convert it with the library that wrote it";
}

// An F4 header shape counts values; torch's float4_e2m1fn_x2 counts the
// bytes holding two each.
std::optional<std::string> to_packed_fp4_shape(Shape& shape) {
  if (shape.empty() || shape.back() % 2 != 0)
    return "F4 shape " + shape_str(shape) + (shape.empty() ? " has no dimension" : " has an odd last dimension") +
           ": two FP4 values fill each byte, so its data cannot end on a byte boundary (safetensors refuses it too)";
  shape.back() /= 2;
  return std::nullopt;
}

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

HeaderTensor parse_tensor(const std::string& name, const nlohmann::ordered_json& info) {
  auto bad = [&](const std::string& why) -> HeaderTensor {
    fail_data_loss("safetensors tensor '" + name + "': " + why);
  };
  if (!info.is_object()) return bad("entry is not an object");
  HeaderTensor t;
  t.name = name;
  auto dt = info.find("dtype");
  if (dt == info.end() || !dt->is_string()) return bad("no dtype");
  auto d = dtype_from_code(dt->get<std::string>());
  if (auto why = fp6_refusal(dt->get<std::string>()))  // not corrupt: unsupported
    fail(ErrorCode::kUnimplemented, "safetensors tensor '" + name + "': " + *why);
  if (!d) return bad("unknown dtype '" + dt->get<std::string>() + "'");
  t.dtype = *d;
  auto sh = info.find("shape");
  if (sh == info.end() || !sh->is_array()) return bad("no shape");
  for (const auto& dim : *sh) {
    if (!dim.is_number_unsigned() && !(dim.is_number_integer() && dim.get<int64_t>() >= 0))
      return bad("shape is not a list of non-negative integers");
    uint64_t v = dim.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return bad("dimension too large");
    t.shape.push_back(static_cast<int64_t>(v));
  }
  if (t.dtype == DType::kFloat4E2M1FNx2)
    if (auto why = to_packed_fp4_shape(t.shape)) return bad(*why);
  auto off = info.find("data_offsets");
  if (off == info.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return bad("data_offsets is not two non-negative integers");
  t.begin = (*off)[0].get<uint64_t>();
  t.end = (*off)[1].get<uint64_t>();
  if (t.end < t.begin) return bad("data_offsets end before they begin");
  uint64_t nbytes = dtype_size(t.dtype);
  for (int64_t dim : t.shape)
    if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(dim), &nbytes))
      return bad("shape " + shape_str(t.shape) + " holds more than 2^64 bytes (safetensors refuses it)");
  if (t.end - t.begin != nbytes)
    return bad("data_offsets hold " + std::to_string(t.end - t.begin) + " bytes, shape and dtype need " +
               std::to_string(nbytes));
  return t;
}

}  // namespace

std::optional<std::string_view> dtype_code(DType d) {
  for (const auto& e : kCodes)
    if (e.dtype == d) return e.code;
  return std::nullopt;
}

std::optional<DType> dtype_from_code(std::string_view code) {
  for (const auto& e : kCodes)
    if (e.code == code) return e.dtype;
  return std::nullopt;
}

Shape header_shape(const std::string& name, DType d, const Shape& shape) {
  if (d != DType::kFloat4E2M1FNx2) return shape;
  if (shape.empty())
    fail_invalid("tensor '" + name +
                 "': a 0-dim float4_e2m1fn_x2 cannot be written as safetensors (its F4 shape counts the two "
                 "values a byte holds, which needs a dimension; safetensors' save_file refuses it too); write .pt "
                 "or .h5");
  Shape out = shape;
  out.back() *= 2;
  return out;
}

int dtype_sort_rank(DType d) {
  for (std::size_t i = 0; i < kCodes.size(); ++i)
    if (kCodes[i].dtype == d) return static_cast<int>(i);
  return -1;
}

Header parse_header(std::string_view text, uint64_t data_size) {
  nlohmann::ordered_json json = parse_ordered_json(text, 64, "safetensors header");
  if (!json.is_object()) fail_data_loss("safetensors header is not a JSON object");
  Header h;
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& key = it.key();
    const auto& value = it.value();
    if (key == "__metadata__") {
      // safetensors reads it as Option<HashMap<String, String>>: null is none.
      if (value.is_null()) continue;
      if (!value.is_object()) fail_data_loss("safetensors __metadata__ is not an object");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) fail_data_loss("safetensors __metadata__ value '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(key, value));
  }
  // Sorted by begin (then end, so empty tensors come first), the ranges
  // must tile the buffer exactly.
  std::vector<const HeaderTensor*> order;
  for (const auto& t : h.tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const HeaderTensor* a, const HeaderTensor* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expect = 0;
  for (const HeaderTensor* t : order) {
    if (t->begin > expect)
      fail_data_loss("safetensors tensor '" + t->name + "': hole in the data buffer before offset " +
                     std::to_string(t->begin));
    if (t->begin < expect)
      fail_data_loss("safetensors tensor '" + t->name + "': data_offsets overlap another tensor at offset " +
                     std::to_string(t->begin));
    expect = t->end;
  }
  if (expect > data_size)
    fail_data_loss("safetensors data_offsets reach " + std::to_string(expect) + " but the data buffer has " +
                   std::to_string(data_size) + " bytes");
  if (expect < data_size)
    fail_data_loss("safetensors data buffer has " + std::to_string(data_size - expect) +
                   " bytes no tensor covers (hole at the end)");
  return h;
}

Header read_header(const ByteSource& file, uint64_t& data_start) {
  if (file.size() < 8) fail_data_loss(file.describe() + ": too short for a safetensors file");
  unsigned char prefix[8];
  file.read(0, prefix, 8);
  uint64_t n = read_u64_le(prefix);
  if (n > kMaxHeaderSize)
    fail_data_loss(file.describe() + ": safetensors header length " + std::to_string(n) + " exceeds the " +
                   std::to_string(kMaxHeaderSize) + "-byte limit");
  if (n > file.size() - 8)
    fail_data_loss(file.describe() + ": safetensors header length " + std::to_string(n) + " is larger than the file");
  data_start = 8 + n;
  std::string text = file.read_string(8, static_cast<std::size_t>(n));
  return with_context(file.describe(), [&] { return parse_header(text, file.size() - data_start); });
}

bool looks_like_safetensors(const ByteSource& source) {
  if (source.size() < 10) return false;
  // safetensors parses the header with serde_json, which skips JSON
  // whitespace before the '{' (a header written as " {...}" loads), so the
  // first 4 KiB after the length may be spaces, tabs and newlines.
  constexpr std::size_t kLook = 4096;
  const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(source.size() - 8, kLook));
  std::string head = source.read_string(8, n);
  // The length is not checked here: read_header refuses a wrong one with a
  // message about the length, which says more than "unrecognised file".
  const std::size_t first = head.find_first_not_of(" \t\n\r");
  return first != std::string::npos && head[first] == '{';
}

}  // namespace ckpt::safetensors
