// safetensors (https://github.com/huggingface/safetensors, README "Format"):
//
//   [0, 8)        N: u64 little-endian, the header's length
//   [8, 8+N)      header: UTF-8 JSON object, padded with spaces to 8 bytes
//                   {"__metadata__": {str: str, ...},            (optional)
//                    "<name>": {"dtype": "F32", "shape": [2, 3],
//                               "data_offsets": [begin, end]}, ...}
//   [8+N, EOF)    data buffer; offsets are relative to its start
//
// The spec's validation: the header is at most 100 MB, every tensor's byte
// range has exactly numel*itemsize bytes, the ranges sorted by begin cover the
// buffer with no hole and no overlap, from 0 to the buffer's end.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "io/byte_source.h"
#include "model/checkpoint_model.h"

namespace ckpt::safetensors {

inline constexpr uint64_t kMaxHeaderSize = 100'000'000;  // safetensors' MAX_HEADER_SIZE

// "F32" for float32; nullopt for dtypes safetensors has no code for.
std::optional<std::string_view> dtype_code(DType d);
std::optional<DType> dtype_from_code(std::string_view code);
// The rank safetensors' writer sorts by (descending): its Dtype enum order.
int dtype_sort_rank(DType d);

// The header's shape for a tensor of `shape`: F4 counts FP4 values, two a
// byte, where torch's float4_e2m1fn_x2 counts bytes, so its last dimension
// is doubled; other dtypes unchanged. InvalidArgument naming `name` for a
// 0-dim float4_e2m1fn_x2 (its two values need a dimension to count them).
Shape header_shape(const std::string& name, DType d, const Shape& shape);

struct HeaderTensor {
  std::string name;
  DType dtype;
  Shape shape;                  // torch's: an F4 tensor's last dimension halved
  uint64_t begin = 0, end = 0;  // in the data buffer
};

struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<HeaderTensor> tensors;  // in header order
};

// Parses and validates header JSON against a data buffer of `data_size`
// bytes. DataLoss naming the tensor for every violation.
Header parse_header(std::string_view json, uint64_t data_size);

// Reads the length prefix and header of a whole file: DataLoss when the
// length exceeds kMaxHeaderSize or the file. Returns the header and sets
// `data_start` to 8+N.
Header read_header(const ByteSource& file, uint64_t& data_start);

// True when the source starts like a safetensors file: an 8-byte length,
// then JSON whitespace and '{'.
bool looks_like_safetensors(const ByteSource& source);

}  // namespace ckpt::safetensors
