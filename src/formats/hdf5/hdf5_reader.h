// Reader of HDF5 files written by ckptconv (docs/hdf5-layout.md) into a
// CheckpointModel. Each dataset is one chunk whose storage reads the
// dataset's rows through HDF5 on demand (chunked and compressed datasets
// alike); tensor bytes are never loaded here. A file without the root
// attribute ckptconv.layout_version is refused (Unimplemented).
#pragma once

#include <string>

#include "model/checkpoint_model.h"

namespace ckpt::hdf5 {

// The structure of a file ckptconv wrote reads in milliseconds, and a slab
// of its tensor bytes in seconds; a reader still busy after this long is
// looping on a corrupt file.
inline constexpr double kRequestTimeoutS = 60;

// libhdf5 reads the file only in a child process (io/isolate.h) that lives
// as long as the model's tensor sources: a corrupt file that crashes
// libhdf5, or hangs it for `timeout_s` on one request, is DataLoss (exit 3),
// never a signal here; the child's memory is the hdf5-memory budget
// (core/budgets.h). The fuzz target passes a short timeout, so that a
// mutant that makes libhdf5 loop costs it a second, not a minute.
CheckpointModel read_hdf5_file(const std::string& path, double timeout_s = kRequestTimeoutS);

}  // namespace ckpt::hdf5
