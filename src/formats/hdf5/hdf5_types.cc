#include "formats/hdf5/hdf5_types.h"

namespace ckpt::hdf5 {
namespace {

Handle copy_of(hid_t t) { return checked_handle(H5Tcopy(t), ErrorCode::kInternal, "H5Tcopy"); }

// IEEE half as h5py makes it (h5t.py: IEEE_F16LE).
Handle half_type() {
  Handle t = copy_of(H5T_IEEE_F32LE);
  check(H5Tset_fields(t, 15, 10, 5, 0, 10), ErrorCode::kInternal, "half type");
  check(H5Tset_size(t, 2), ErrorCode::kInternal, "half type");
  check(H5Tset_ebias(t, 15), ErrorCode::kInternal, "half type");
  return t;
}

// h5py's bool: an int8 enum FALSE=0, TRUE=1.
Handle bool_type() {
  Handle t = checked_handle(H5Tenum_create(H5T_NATIVE_INT8), ErrorCode::kInternal, "bool type");
  int8_t f = 0, v = 1;
  check(H5Tenum_insert(t, "FALSE", &f), ErrorCode::kInternal, "bool type");
  check(H5Tenum_insert(t, "TRUE", &v), ErrorCode::kInternal, "bool type");
  return t;
}

// h5py's complex: a compound {r, i}.
Handle complex_type(hid_t part, std::size_t part_size) {
  Handle t = checked_handle(H5Tcreate(H5T_COMPOUND, 2 * part_size), ErrorCode::kInternal, "complex type");
  check(H5Tinsert(t, "r", 0, part), ErrorCode::kInternal, "complex type");
  check(H5Tinsert(t, "i", part_size, part), ErrorCode::kInternal, "complex type");
  return t;
}

}  // namespace

Handle hdf5_type_for(DType d) {
  switch (d) {
    case DType::kFloat64: return copy_of(H5T_IEEE_F64LE);
    case DType::kFloat32: return copy_of(H5T_IEEE_F32LE);
    case DType::kFloat16: return half_type();
    case DType::kBFloat16: return copy_of(H5T_STD_U16LE);
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat8E8M0FNU:
    case DType::kFloat4E2M1FNx2: return copy_of(H5T_STD_U8LE);
    case DType::kInt8: return copy_of(H5T_STD_I8LE);
    case DType::kInt16: return copy_of(H5T_STD_I16LE);
    case DType::kInt32: return copy_of(H5T_STD_I32LE);
    case DType::kInt64: return copy_of(H5T_STD_I64LE);
    case DType::kUInt8: return copy_of(H5T_STD_U8LE);
    case DType::kUInt16: return copy_of(H5T_STD_U16LE);
    case DType::kUInt32: return copy_of(H5T_STD_U32LE);
    case DType::kUInt64: return copy_of(H5T_STD_U64LE);
    case DType::kBool: return bool_type();
    case DType::kComplex32: return copy_of(H5T_STD_U32LE);
    case DType::kComplex64: return complex_type(H5T_IEEE_F32LE, 4);
    case DType::kComplex128: return complex_type(H5T_IEEE_F64LE, 8);
  }
  fail(ErrorCode::kInternal, "no HDF5 type for dtype");
}

}  // namespace ckpt::hdf5
