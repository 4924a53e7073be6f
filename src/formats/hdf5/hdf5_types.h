// Torch dtypes as HDF5 types (docs/hdf5-layout.md, "Datasets"): the native
// type where HDF5 has one (IEEE floats incl. h5py's half, integers, h5py's
// bool enum and complex compounds), else unsigned integers of the same width
// holding the bits (bfloat16, float8, complex32). Every dataset also names
// its torch dtype in a `dtype` attribute.
#pragma once

#include "core/dtype.h"
#include "formats/hdf5/hdf5_handle.h"

namespace ckpt::hdf5 {

Handle hdf5_type_for(DType d);

}  // namespace ckpt::hdf5
