// ckpt::DType codes <-> c10::ScalarType, inside the LibTorch plugin.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "core/dtype.h"

namespace ckpt {

inline std::optional<c10::ScalarType> to_scalar_type(int code) {
  switch (static_cast<DType>(code)) {
    case DType::kFloat64: return c10::ScalarType::Double;
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kFloat16: return c10::ScalarType::Half;
    case DType::kBFloat16: return c10::ScalarType::BFloat16;
    case DType::kFloat8E4M3FN: return c10::ScalarType::Float8_e4m3fn;
    case DType::kFloat8E4M3FNUZ: return c10::ScalarType::Float8_e4m3fnuz;
    case DType::kFloat8E5M2: return c10::ScalarType::Float8_e5m2;
    case DType::kFloat8E5M2FNUZ: return c10::ScalarType::Float8_e5m2fnuz;
    case DType::kFloat8E8M0FNU: return c10::ScalarType::Float8_e8m0fnu;
    case DType::kInt8: return c10::ScalarType::Char;
    case DType::kInt16: return c10::ScalarType::Short;
    case DType::kInt32: return c10::ScalarType::Int;
    case DType::kInt64: return c10::ScalarType::Long;
    case DType::kUInt8: return c10::ScalarType::Byte;
    case DType::kUInt16: return c10::ScalarType::UInt16;
    case DType::kUInt32: return c10::ScalarType::UInt32;
    case DType::kUInt64: return c10::ScalarType::UInt64;
    case DType::kBool: return c10::ScalarType::Bool;
    case DType::kComplex32: return c10::ScalarType::ComplexHalf;
    case DType::kComplex64: return c10::ScalarType::ComplexFloat;
    case DType::kComplex128: return c10::ScalarType::ComplexDouble;
    case DType::kFloat4E2M1FNx2: return c10::ScalarType::Float4_e2m1fn_x2;
  }
  return std::nullopt;
}

}  // namespace ckpt
