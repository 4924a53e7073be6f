// Compares two checkpoints of any families and layouts, leaf by leaf: the
// leaves are matched by dotted path (model/tree_walk.h), so a DCP directory,
// its consolidated .pt and an .h5 or .safetensors of it line up.
//
// Differences: a path only in A or only in B; a tensor on one side and a
// value on the other; for tensors on both sides, a shape (values not
// compared) or dtype difference (values still compared, in double), and
// elements outside tolerance (diff/tensor_diff.h); for values on both sides,
// any difference of their JSON form (model/value_json.h: numbers by value,
// so 1 equals 1.0; a tuple differs from a list).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "diff/tensor_diff.h"
#include "model/checkpoint_model.h"

namespace ckpt {

struct DiffOptions {
  Tolerance tolerance;
  bool ignore_dtype = false;  // a dtype difference alone is a note, not a difference
  // A BytesIO value on one side and its bytes on the other are equal (the
  // rule consolidate applies to torchtitan's train_state), counted in
  // DiffReport::bytes_io_as_bytes; strict: they differ.
  bool strict = false;
  StreamOptions stream;
};

struct TensorDiff {
  std::string path;
  DType dtype_a = DType::kFloat32, dtype_b = DType::kFloat32;
  Shape shape_a, shape_b;
  // Present when values_comparable() (the values were compared).
  std::optional<ValueStats> values;

  bool dtype_differs() const { return dtype_a != dtype_b; }
  bool shape_differs() const { return shape_a != shape_b; }
  // Same shape, and float4_e2m1fn_x2 on both sides or neither (its element
  // packs two values: against any other dtype its values do not line up).
  bool values_comparable() const;
  bool equal(const DiffOptions& options) const;
};

// A leaf whose values differ, or which is a tensor on one side and a value
// on the other (that side's JSON is then {"__tensor__": {"dtype", "shape"}}).
struct ValueDiff {
  std::string path;
  nlohmann::ordered_json a, b;
};

// One dotted path reached through different containers or key types on
// the two sides ({'a.b': t} vs {'a': {'b': t}}, [t] vs {'0': t}, {'0': t}
// vs {0: t}).
struct StructureDiff {
  std::string path;
  std::string a, b;  // Leaf::structure
};

struct Side {
  std::string source;  // the path given
  std::string format;  // CheckpointModel::format
};

struct DiffReport {
  Side a, b;
  DiffOptions options;
  std::vector<std::string> only_in_a, only_in_b;  // dotted paths, in tree order
  std::vector<TensorDiff> tensors;                // every tensor on both sides, in A's order
  std::vector<ValueDiff> values;                  // differing value leaves only
  std::vector<StructureDiff> structure;           // paths whose containers or key types differ
  uint64_t values_compared = 0;                   // value leaves on both sides
  uint64_t bytes_io_as_bytes = 0;                 // BytesIO vs its bytes, taken as equal (not strict)

  std::size_t tensors_differing() const;
  bool equal() const;
};

// Bytes diff reads to compare these models' values (for progress).
uint64_t diff_read_bytes(const CheckpointModel& a, const CheckpointModel& b);

// Compares two validated models (model/validate.h require_valid).
DiffReport diff_models(const CheckpointModel& a, const CheckpointModel& b, const DiffOptions& options);

}  // namespace ckpt
