#include "core/dtype.h"

#include <array>

namespace ckpt {
namespace {

// Order matches enum DType.
constexpr std::array<DTypeInfo, 22> kTable = {{
    {DType::kFloat64, "float64", 8, "DoubleStorage", true, false},
    {DType::kFloat32, "float32", 4, "FloatStorage", true, false},
    {DType::kFloat16, "float16", 2, "HalfStorage", true, false},
    {DType::kBFloat16, "bfloat16", 2, "BFloat16Storage", true, false},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1, "", true, false},
    {DType::kFloat8E4M3FNUZ, "float8_e4m3fnuz", 1, "", true, false},
    {DType::kFloat8E5M2, "float8_e5m2", 1, "", true, false},
    {DType::kFloat8E5M2FNUZ, "float8_e5m2fnuz", 1, "", true, false},
    {DType::kFloat8E8M0FNU, "float8_e8m0fnu", 1, "", true, false},
    {DType::kInt8, "int8", 1, "CharStorage", false, false},
    {DType::kInt16, "int16", 2, "ShortStorage", false, false},
    {DType::kInt32, "int32", 4, "IntStorage", false, false},
    {DType::kInt64, "int64", 8, "LongStorage", false, false},
    {DType::kUInt8, "uint8", 1, "ByteStorage", false, false},
    {DType::kUInt16, "uint16", 2, "", false, false},
    {DType::kUInt32, "uint32", 4, "", false, false},
    {DType::kUInt64, "uint64", 8, "", false, false},
    {DType::kBool, "bool", 1, "BoolStorage", false, false},
    {DType::kComplex32, "complex32", 4, "", false, true},
    {DType::kComplex64, "complex64", 8, "ComplexFloatStorage", false, true},
    {DType::kComplex128, "complex128", 16, "ComplexDoubleStorage", false, true},
    {DType::kFloat4E2M1FNx2, "float4_e2m1fn_x2", 1, "", false, false},
}};

struct Alias {
  std::string_view alias;
  DType dtype;
};
constexpr std::array<Alias, 9> kAliases = {{
    {"double", DType::kFloat64},
    {"float", DType::kFloat32},
    {"half", DType::kFloat16},
    {"short", DType::kInt16},
    {"int", DType::kInt32},
    {"long", DType::kInt64},
    {"cfloat", DType::kComplex64},
    {"cdouble", DType::kComplex128},
    {"chalf", DType::kComplex32},
}};

}  // namespace

const DTypeInfo& dtype_info(DType d) { return kTable[static_cast<std::size_t>(d)]; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kTable)
    if (info.name == name) return info.dtype;
  for (const auto& a : kAliases)
    if (a.alias == name) return a.dtype;
  return std::nullopt;
}

std::optional<DType> dtype_from_storage_class(std::string_view storage_class) {
  for (const auto& info : kTable)
    if (!info.storage_class.empty() && info.storage_class == storage_class) return info.dtype;
  return std::nullopt;
}

}  // namespace ckpt
