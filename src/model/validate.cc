#include "model/validate.h"

#include <algorithm>

#include "core/checked.h"
#include "core/error.h"

namespace ckpt {
namespace {

std::string chunk_label(const TensorEntry& t, std::size_t i) {
  const TensorChunk& c = t.chunks[i];
  std::string s = "tensor '" + t.name + "' chunk " + std::to_string(i) + " (offsets " + shape_str(c.offsets) +
                  ", sizes " + shape_str(c.sizes);
  if (!c.file.empty()) s += ", file " + c.file;
  if (c.rank >= 0) s += ", rank " + std::to_string(c.rank);
  return s + ")";
}

// Empty when the chunk's box and storage view are sound.
std::string chunk_problem(const TensorEntry& t, const TensorChunk& c) {
  std::size_t rank = t.shape.size();
  if (c.offsets.size() != rank || c.sizes.size() != rank || c.strides.size() != rank)
    return "has " + std::to_string(c.sizes.size()) + " dimensions, the tensor has " + std::to_string(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.strides[d] < 0) return "has a negative offset, size or stride";
    if (c.offsets[d] > t.shape[d] || c.sizes[d] > t.shape[d] - c.offsets[d])
      return "lies outside the tensor's shape " + shape_str(t.shape);
  }
  if (c.numel() == 0) return {};
  if (!c.storage) return "has no storage";
  if (c.storage_offset < 0) return "has a negative storage offset";
  uint64_t last = static_cast<uint64_t>(c.storage_offset);
  for (std::size_t d = 0; d < rank; ++d)
    last = checked_add(last, checked_mul(static_cast<uint64_t>(c.sizes[d] - 1), static_cast<uint64_t>(c.strides[d])));
  uint64_t need = checked_mul(checked_add(last, 1), dtype_size(t.dtype));
  if (need > c.storage->size())
    return "needs " + std::to_string(need) + " storage bytes, " + c.storage->describe() + " has " +
           std::to_string(c.storage->size());
  return {};
}

bool boxes_overlap(const TensorChunk& a, const TensorChunk& b) {
  for (std::size_t d = 0; d < a.sizes.size(); ++d) {
    int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (lo >= hi) return false;
  }
  return true;
}

}  // namespace

void visit_tensor_problems(const TensorEntry& t, const TensorProblemVisitor& report) {
  bool boxes_ok = true;
  for (std::size_t i = 0; i < t.chunks.size(); ++i) {
    std::string p = chunk_problem(t, t.chunks[i]);
    if (!p.empty()) {
      report(chunk_label(t, i) + " " + p, &t.chunks[i]);
      boxes_ok = false;
    }
  }
  if (!boxes_ok) return;
  uint64_t covered = 0;
  bool overlaps = false;
  for (std::size_t i = 0; i < t.chunks.size(); ++i) {
    if (t.chunks[i].numel() == 0) continue;
    covered = checked_add(covered, t.chunks[i].numel());
    for (std::size_t j = i + 1; j < t.chunks.size(); ++j)
      if (t.chunks[j].numel() != 0 && boxes_overlap(t.chunks[i], t.chunks[j])) {
        report(chunk_label(t, i) + " overlaps " + chunk_label(t, j), &t.chunks[j]);
        overlaps = true;
      }
  }
  if (!overlaps && covered != t.numel())
    report("tensor '" + t.name + "' of shape " + shape_str(t.shape) + " has chunks covering " + std::to_string(covered) +
               " of its " + std::to_string(t.numel()) + " elements (a gap)",
           nullptr);
}

std::vector<std::string> tensor_problems(const TensorEntry& t) {
  std::vector<std::string> out;
  visit_tensor_problems(t, [&](const std::string& message, const TensorChunk*) { out.push_back(message); });
  return out;
}

std::vector<std::string> model_problems(const CheckpointModel& model) {
  std::vector<std::string> out;
  for (const auto& t : model.tensors) {
    auto p = tensor_problems(t);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

void require_valid(const CheckpointModel& model) {
  auto problems = model_problems(model);
  if (problems.empty()) return;
  std::string msg = model.source + ": checkpoint is inconsistent: " + problems.front();
  if (problems.size() > 1) msg += " (and " + std::to_string(problems.size() - 1) + " more problems)";
  fail_data_loss(msg);
}

}  // namespace ckpt
