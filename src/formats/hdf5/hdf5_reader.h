// Reader of HDF5 files written by ckptconv (docs/hdf5-layout.md) into a
// CheckpointModel. Each dataset is one chunk whose storage reads the
// dataset's rows through HDF5 on demand (chunked and compressed datasets
// alike); tensor bytes are never loaded here. A file without the root
// attribute ckptconv.layout_version is refused (Unimplemented).
#pragma once

#include <string>

#include "model/checkpoint_model.h"

namespace ckpt::hdf5 {

CheckpointModel read_hdf5_file(const std::string& path);

}  // namespace ckpt::hdf5
