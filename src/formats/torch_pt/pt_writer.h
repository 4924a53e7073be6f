// Writer of torch.save archives that torch.load(weights_only=True) reads:
// data.pkl (protocol 2) first, then the fixed records, each tensor's storage
// as data/<key> in order of first appearance, version, serialization id.
//
//   archive/data.pkl              pickle: tensors as _rebuild_tensor_v2/_v3
//   archive/.format_version       "1"
//   archive/.storage_alignment    "64"
//   archive/byteorder             "little"
//   archive/data/0 ... data/N-1   contiguous row-major tensor bytes
//   archive/version               "3\n"
//   archive/.data/serialization_id
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "archive/zip_writer.h"
#include "io/byte_sink.h"
#include "model/checkpoint_model.h"

namespace ckpt::torch_pt {

struct OutputTensor {
  DType dtype;
  Shape shape;
  bool parameter = false;  // rebuild as nn.Parameter
  bool requires_grad = false;
};

// Appends exactly numel*itemsize contiguous bytes of tensor `index`.
using FillTensor = std::function<void(std::size_t index, archive::ZipWriter& zip)>;

// Writes `root` (a value tree in which tensor references index `tensors`).
// Each referenced tensor is stored once, even when referenced many times.
// `archive_name` is the records' folder: torch.save names it after the
// file's stem (fp32.pt holds fp32/data.pkl); torch.load accepts any.
void write_pt(ByteSink& sink, const pickle::Value& root, const std::vector<OutputTensor>& tensors,
              const FillTensor& fill, const std::string& archive_name = "archive");

}  // namespace ckpt::torch_pt
