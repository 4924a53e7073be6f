#include "model/checkpoint_model.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/checked.h"
#include "core/error.h"

namespace ckpt {

uint64_t shape_numel(const Shape& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail_data_loss("negative dimension in shape " + shape_str(shape));
    n = checked_mul(n, static_cast<uint64_t>(d), "element count");
  }
  return n;
}

std::string box_str(const Shape& offsets, const Shape& sizes) {
  std::string s = "[";
  for (std::size_t d = 0; d < offsets.size() && d < sizes.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(offsets[d]) + ":" + std::to_string(offsets[d] + sizes[d]);
  }
  return s + "]";
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

bool TensorChunk::is_whole_contiguous_storage(std::size_t itemsize) const {
  if (storage_offset != 0 || !storage) return false;
  uint64_t n = numel();
  if (n * itemsize != storage->size()) return false;
  if (n <= 1) return true;
  // Dimensions of extent 1 may carry any stride; the rest must be row-major.
  int64_t expect = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expect) return false;
    expect *= sizes[i];
  }
  return true;
}

namespace {
const pickle::ValuePtr& tensor_ref_global() {
  static const pickle::ValuePtr g = pickle::Value::global("ckptconv", "tensor");
  return g;
}
}  // namespace

pickle::ValuePtr make_tensor_ref(std::size_t index) {
  return pickle::Value::call(tensor_ref_global(),
                             pickle::Value::tuple({pickle::Value::integer(static_cast<int64_t>(index))}));
}

void prune_unreferenced(const pickle::ValuePtr& root, std::vector<TensorEntry>& tensors, std::size_t first_index) {
  std::vector<pickle::Value*> refs;
  if (root)
    pickle::find_node(*root, [&](pickle::Value& v) {
      if (tensor_ref_index(v)) refs.push_back(&v);
      return false;  // visit every node
    });
  std::vector<TensorEntry> kept;
  std::unordered_map<std::size_t, std::size_t> renumber;
  std::sort(refs.begin(), refs.end(), [](const pickle::Value* a, const pickle::Value* b) {
    return *tensor_ref_index(*a) < *tensor_ref_index(*b);
  });
  for (pickle::Value* ref : refs) {
    std::size_t old = *tensor_ref_index(*ref);
    auto [it, fresh] = renumber.emplace(old, kept.size());
    if (fresh) kept.push_back(std::move(tensors.at(old)));
    ref->args->items[0] = pickle::Value::integer(static_cast<int64_t>(first_index + it->second));
  }
  tensors = std::move(kept);
}

std::optional<std::size_t> tensor_ref_index(const pickle::Value& value) {
  if (!value.is(pickle::Kind::kCall) || !value.callable || !value.callable->is_global("ckptconv", "tensor"))
    return std::nullopt;
  if (!value.args || !value.args->is(pickle::Kind::kTuple) || value.args->items.size() != 1) return std::nullopt;
  return static_cast<std::size_t>(value.args->items[0]->int_value);
}

}  // namespace ckpt

namespace ckpt {

pickle::ValuePtr adopt(CheckpointModel& into, CheckpointModel part) {
  if (!part.root) return part.root;
  prune_unreferenced(part.root, part.tensors, into.tensors.size());
  for (auto& t : part.tensors) into.tensors.push_back(std::move(t));
  return part.root;
}

}  // namespace ckpt
