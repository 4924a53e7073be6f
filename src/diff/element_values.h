// Tensor elements as numbers, decoded natively from their bytes for every
// dtype torch has (no LibTorch): what diff compares.
//
// Floating dtypes decode exactly to double (every float16, bfloat16, float8
// and float32 value is a double); complex elements to (real, imaginary)
// pairs. Integers and bool decode exactly to a 128-bit integer, so that
// int64/uint64 values beyond 2^53 still compare exactly; to double they
// round as a cast would.
//
// Float8 layouts (sign.exponent.mantissa, bias), as c10/util/Float8_*.h:
//   e4m3fn    1.4.3 bias 7   no Inf; NaN S.1111.111
//   e4m3fnuz  1.4.3 bias 8   no Inf, no -0; NaN 1.0000.000 (0x80)
//   e5m2      1.5.2 bias 15  IEEE: exponent 11111 is Inf (mantissa 0) or NaN
//   e5m2fnuz  1.5.2 bias 16  no Inf, no -0; NaN 0x80
//   e8m0fnu   0.8.0 bias 127 2^(e-127), no zero, no sign; NaN 0xFF
// float4_e2m1fn_x2 packs two e2m1 values (1.2.1, bias 1, no Inf, no NaN:
// +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}) in a byte, the first in the low nibble (as
// torch.testing._internal.common_quantized.pack_uint4 packs them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ckpt {

using WideInt = __int128;

// True for int*, uint* and bool: decode_integers applies.
bool is_integer_dtype(DType dtype);
// Doubles per element: 2 for complex dtypes, else 1.
inline int value_parts(DType dtype) { return dtype_info(dtype).is_complex ? 2 : 1; }

// Values an element holds: 2 for float4_e2m1fn_x2, else 1. Its values are
// compared one by one (diff's indices and counts are of values).
inline int packed_values(DType dtype) { return dtype == DType::kFloat4E2M1FNx2 ? 2 : 1; }

// Decodes n elements of `dtype` at `src` (unaligned is fine) into out[0 ..
// n * value_parts(dtype) * packed_values(dtype)): complex as real,
// imaginary; float4_e2m1fn_x2 low nibble, high nibble.
void decode_to_double(const std::byte* src, DType dtype, std::size_t n, double* out);

// Decodes n integer or bool elements exactly; Internal for other dtypes.
void decode_integers(const std::byte* src, DType dtype, std::size_t n, WideInt* out);

// One element of a one-byte float8 dtype, or of float16 / bfloat16 from its
// 16 bits; exposed for tests.
double float8_to_double(uint8_t bits, DType dtype);
double float4_e2m1_to_double(uint8_t nibble);
double float16_to_double(uint16_t bits);
double bfloat16_to_double(uint16_t bits);

}  // namespace ckpt
