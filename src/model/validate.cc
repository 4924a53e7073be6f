#include "model/validate.h"

#include <algorithm>
#include <limits>

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
  // A crafted offset or stride past 2^64 bytes is this chunk's problem,
  // reported with its tensor and file like any other (not a bare overflow).
  uint64_t last = static_cast<uint64_t>(c.storage_offset), need = 0;
  bool overflow = false;
  for (std::size_t d = 0; d < rank; ++d) {
    uint64_t step = 0;
    overflow =
        overflow ||
        __builtin_mul_overflow(static_cast<uint64_t>(c.sizes[d] - 1), static_cast<uint64_t>(c.strides[d]), &step) ||
        __builtin_add_overflow(last, step, &last);
  }
  overflow =
      overflow || __builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, dtype_size(t.dtype), &need);
  if (overflow) return "addresses storage past 2^64 bytes (storage offset " + std::to_string(c.storage_offset) + ")";
  if (need > c.storage->size())
    return "needs " + std::to_string(need) + " storage bytes, " + c.storage->describe() + " has " +
           std::to_string(c.storage->size());
  return {};
}

// Empty when the tensor's shape is one torch can hold: dimensions not
// negative, an element count that fits int64 (torch.load refuses more:
// "numel: integer multiplication overflow") and a byte count, read and
// written, that fits 64 bits. Checked before anything multiplies them: a
// (2^62, 3) float32 view of stride 0 had 3 * 2^64 bytes, which wrapped to 0:
// validate said VALID and consolidate passed the free-space check.
}  // namespace

std::string tensor_shape_problem(const TensorEntry& t) {
  uint64_t n = 1, in_bytes = 0, out_bytes = 0;
  for (int64_t d : t.shape) {
    if (d < 0) return "has a negative dimension";
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) ||
        n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return "has more than 2^63 - 1 elements (torch.load refuses it)";
  }
  if (__builtin_mul_overflow(n, dtype_size(t.dtype), &in_bytes) ||
      __builtin_mul_overflow(n, dtype_size(t.output_dtype()), &out_bytes))
    return "has " + std::to_string(n) + " elements, whose bytes overflow 64 bits";
  return {};
}

namespace {

bool boxes_overlap(const TensorChunk& a, const TensorChunk& b) {
  for (std::size_t d = 0; d < a.sizes.size(); ++d) {
    int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (lo >= hi) return false;
  }
  return true;
}

}  // namespace

void visit_tensor_problems(const TensorEntry& t, const TensorProblemVisitor& visit) {
  auto report = [&](std::string message, const TensorChunk* chunk) {
    visit(Problem{ErrorCode::kDataLoss, std::move(message), chunk ? chunk->file : "", chunk ? chunk->rank : -1, t.name},
          chunk == nullptr);
  };
  if (std::string p = tensor_shape_problem(t); !p.empty()) {
    // Not a gap: the tensor's own record says it, in the first chunk's file.
    const TensorChunk* first = t.chunks.empty() ? nullptr : &t.chunks.front();
    visit(Problem{ErrorCode::kDataLoss, "tensor '" + t.name + "' of shape " + shape_str(t.shape) + " " + p,
                  first ? first->file : "", first ? first->rank : -1, t.name},
          false);
    return;
  }
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
    report("tensor '" + t.name + "' of shape " + shape_str(t.shape) + " has chunks covering " +
               std::to_string(covered) + " of its " + std::to_string(t.numel()) + " elements (a gap)",
           nullptr);
}

void check_model(const CheckpointModel& model, ProblemSink& sink) {
  for (const auto& t : model.tensors) visit_tensor_problems(t, [&](Problem p, bool) { sink.report(std::move(p)); });
}

void require_valid(const CheckpointModel& model) {
  ProblemSink sink;
  check_model(model, sink);
  const auto& problems = sink.problems();
  if (problems.empty()) return;
  std::string msg = model.source + ": checkpoint is inconsistent: " + problems.front().message;
  if (problems.size() > 1) msg += " (and " + std::to_string(problems.size() - 1) + " more problems)";
  fail_data_loss(msg);
}

}  // namespace ckpt
