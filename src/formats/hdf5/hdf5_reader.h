// Reader of HDF5 files written by ckptconv (docs/hdf5-layout.md) into a
// CheckpointModel. Each dataset is one chunk whose storage reads the
// dataset's rows through HDF5 on demand (chunked and compressed datasets
// alike); tensor bytes are never loaded here. A file without the root
// attribute ckptconv.layout_version is refused (Unimplemented).
#pragma once

#include <cstdint>
#include <string>

#include "model/checkpoint_model.h"

namespace ckpt::hdf5 {

// The structure of a file ckptconv wrote reads in milliseconds; a child still
// busy after this long is looping on a corrupt one.
inline constexpr double kStructureTimeoutS = 60;

// The read runs first in a child process (io/isolate.h): a corrupt file that
// crashes libhdf5, or hangs it for `structure_timeout_s`, is DataLoss
// (exit 3), never a signal here; the child's memory is the hdf5-memory
// budget (core/budgets.h). The fuzz target passes a short timeout, so
// that a mutant that makes libhdf5 loop costs it seconds, not a minute.
CheckpointModel read_hdf5_file(const std::string& path, double structure_timeout_s = kStructureTimeoutS);
// The same read without the child: for the fuzz target and the child itself.
CheckpointModel read_hdf5_in_process(const std::string& path);

}  // namespace ckpt::hdf5
