// Element types of tensors as torch names them, with the facts every format
// needs: size, torch storage class, torch dtype attribute name.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ckpt {

enum class DType {
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat8E4M3FN,
  kFloat8E4M3FNUZ,
  kFloat8E5M2,
  kFloat8E5M2FNUZ,
  kFloat8E8M0FNU,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kBool,
  kComplex32,
  kComplex64,
  kComplex128,
  // Two e2m1 values in one byte (torch.float4_e2m1fn_x2): an element is the
  // byte, so shapes count bytes (safetensors' F4 counts values). Packed
  // quantized data: never cast, no NaN or Inf (is_floating is false).
  // Last, so that the codes of the others (passed to the plugins) stay.
  kFloat4E2M1FNx2,
};

struct DTypeInfo {
  DType dtype;
  std::string_view name;           // torch attribute: "float32" (torch.float32)
  std::size_t itemsize;            // bytes per element
  std::string_view storage_class;  // typed storage class ("FloatStorage"), empty if none (v3 only)
  bool is_floating;                // one floating value per element (not complex, not packed float4):
                                   // subject to --dtype casts and finite scans
  bool is_complex;
};

const DTypeInfo& dtype_info(DType d);
inline std::string_view dtype_name(DType d) { return dtype_info(d).name; }
inline std::size_t dtype_size(DType d) { return dtype_info(d).itemsize; }

// "float32", also torch aliases such as "float", "half", "double", "long".
std::optional<DType> dtype_from_name(std::string_view name);
// "FloatStorage" -> float32.
std::optional<DType> dtype_from_storage_class(std::string_view storage_class);

}  // namespace ckpt
