// Reader of HDF5 files written by ckptconv (docs/hdf5-layout.md) into a
// CheckpointModel. Each dataset is one chunk whose storage reads the
// dataset's rows through HDF5 on demand (chunked and compressed datasets
// alike); tensor bytes are never loaded here. A file without the root
// attribute ckptconv.layout_version is refused (Unimplemented).
#pragma once

#include <string>

#include "model/checkpoint_model.h"

namespace ckpt::hdf5 {

// The read runs first in a child process (io/isolate.h): a corrupt file that
// crashes or hangs libhdf5 is DataLoss (exit 3), never a signal here.
CheckpointModel read_hdf5_file(const std::string& path);
// The same read without the child: for the fuzz target and the child itself.
CheckpointModel read_hdf5_in_process(const std::string& path);

}  // namespace ckpt::hdf5
