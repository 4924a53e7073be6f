// Writer of a CheckpointModel as an HDF5 file in the layout of
// docs/hdf5-layout.md (version kLayoutVersion): a group per dict/list level,
// one dataset per tensor with its shape and native HDF5 type, non-tensor
// values as JSON string attributes of their group.
//
// Each dataset is created at full size, chunked along dim 0, and filled by
// FillTensor through a ByteSink that turns the row-major byte stream into
// dim-0 hyperslab writes: memory stays at most one row beyond what the
// caller hands over.
#pragma once

#include <functional>
#include <string>

#include "io/byte_sink.h"
#include "model/checkpoint_model.h"

namespace ckpt::hdf5 {

struct WriteOptions {
  bool gzip = false;  // shuffle + deflate on every chunked dataset
  int gzip_level = 4;
  bool stream = false;  // a durable output: dataset bytes go to the disk as written (io/writeback.h)
};

// Appends exactly the output bytes of tensor `index`.
using FillTensor = std::function<void(std::size_t index, ByteSink& sink)>;

// Creates `path` (truncating it: the caller passes its temp name) and writes
// the model. OutputFailed naming the dataset when HDF5 fails.
void write_hdf5(const std::string& path, const CheckpointModel& model, const WriteOptions& options,
                const FillTensor& fill);

}  // namespace ckpt::hdf5
