#include "formats/zero/tensor_parallel.h"

#include <algorithm>

#include "core/error.h"
#include "model/tensor_compare.h"

namespace ckpt::zero {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// DeepSpeed's keys (deepspeed/checkpoint/constants.py).
constexpr const char* kReplicated = "tp_replicated_parameter_patterns";
constexpr const char* kAverage = "parameter_to_average_patterns";
constexpr const char* kRowParallel = "parameter_with_row_parallelism_patterns";
constexpr const char* kVocabulary = "vocabulary_parameter_patterns";
constexpr const char* kTwoSubParams = "parameter_with_2_sub_params_cat_dim_0";
constexpr const char* kSubParams = "parameter_with_sub_params";
constexpr const char* kAffineMap = "affine_map";

bool non_empty(const ValuePtr& v) {
  if (!v || v->is(Kind::kNone)) return false;
  if (v->is(Kind::kList) || v->is(Kind::kTuple)) return !v->items.empty();
  if (v->is(Kind::kDict)) return !v->entries.empty();
  return true;
}

// The part of chunk `c` whose coordinate along `d` lies in [lo, hi), moved by
// `shift` along d; nullopt when none of it does.
std::optional<TensorChunk> cut(const TensorChunk& c, std::size_t d, int64_t lo, int64_t hi, int64_t shift) {
  const int64_t a = std::max(lo, c.offsets[d]), b = std::min(hi, c.offsets[d] + c.sizes[d]);
  if (a >= b) return std::nullopt;
  TensorChunk out = c;
  out.storage_offset += (a - c.offsets[d]) * c.strides[d];
  out.offsets[d] = a + shift;
  out.sizes[d] = b - a;
  return out;
}

void append_cut(TensorEntry& out, const TensorEntry& t, std::size_t d, int64_t lo, int64_t hi, int64_t shift) {
  for (const TensorChunk& c : t.chunks)
    if (std::optional<TensorChunk> piece = cut(c, d, lo, hi, shift)) out.chunks.push_back(std::move(*piece));
}

}  // namespace

TensorParallelRules::TensorParallelRules(const Value& info, const std::string& path) : path_(path) {
  const std::string where = path + ": universal_checkpoint_info";
  if (!info.is(Kind::kDict)) fail_data_loss(where + " is not a dict");
  for (const char* key : {kSubParams, kAffineMap})
    if (non_empty(info.get(key)))
      fail(ErrorCode::kUnimplemented, where + " has '" + key +
                                          "': sub-parameters of declared shapes and affine maps are not merged by "
                                          "ckptconv (it merges the tensor-parallel categories of "
                                          "ds_to_universal.py's merge_tp_slices up to 2 sub-parameters)");
  auto read = [&](const char* key, Category& into) {
    ValuePtr list = info.get(key);
    if (!list || list->is(Kind::kNone)) return;
    if (!list->is(Kind::kList) && !list->is(Kind::kTuple)) fail_data_loss(where + "['" + key + "'] is not a list");
    for (const auto& p : list->items) {
      if (!p->is(Kind::kStr)) fail_data_loss(where + "['" + key + "'] holds a non-string");
      // re.match: anchored at the start, not at the end
      into.patterns.emplace_back(p->text, LinearRegex::compile("^(?:" + p->text + ")"));
    }
  };
  read(kReplicated, replicated_);
  read(kAverage, averaged_);
  read(kRowParallel, row_parallel_);
  read(kVocabulary, vocabulary_);
  read(kTwoSubParams, two_sub_params_);
  if (ValuePtr v = info.get("original_vocab_size"); v && v->is(Kind::kInt)) original_vocab_size_ = v->int_value;
  if (!vocabulary_.patterns.empty() && !original_vocab_size_)
    fail_data_loss(where + " names vocabulary parameters but no original_vocab_size");
}

std::optional<std::string> TensorParallelRules::Category::match(const std::string& name,
                                                                const std::string& path) const {
  std::optional<std::string> hit;
  for (const auto& [text, re] : patterns) {
    if (!re.search(name)) continue;
    if (hit)
      fail_data_loss(path + ": universal_checkpoint_info patterns '" + *hit + "' and '" + text + "' both match '" +
                     name + "'");
    hit = text;
  }
  return hit;
}

TensorParallelRule TensorParallelRules::rule_for(const std::string& name) const {
  // merge_tp_slices' order: replicated, averaged, two sub-parameters, else a
  // concatenation (dim 1 for row parallelism); vocabulary on top of any.
  TensorParallelRule out;
  if (replicated_.match(name, path_)) {
    out.merge.kind = TensorParallelMerge::Kind::kReplicated;
  } else if (averaged_.match(name, path_)) {
    out.merge.kind = TensorParallelMerge::Kind::kReplicated;
    out.averaged = true;
  } else if (two_sub_params_.match(name, path_)) {
    out.merge.kind = TensorParallelMerge::Kind::kTwoSubParams;
  } else {
    out.merge.cat_dim = row_parallel_.match(name, path_) ? 1 : 0;
  }
  out.merge.vocabulary = vocabulary_.match(name, path_).has_value();
  return out;
}

TensorEntry merge_slices(const std::vector<const TensorEntry*>& slices, const TensorParallelRule& rule,
                         const TensorParallelRules& rules, const std::string& name) {
  const TensorEntry& first = *slices.at(0);
  const std::string& path = rules.path_;
  for (std::size_t t = 1; t < slices.size(); ++t)
    if (slices[t]->dtype != first.dtype || slices[t]->shape.size() != first.shape.size())
      fail_data_loss(path + ": '" + name + "' is " + shape_str(slices[t]->shape) + " on tensor-parallel rank " +
                     std::to_string(t) + ", " + shape_str(first.shape) + " on rank 0 (or of another dtype)");
  TensorEntry out = first;
  out.name = name;
  out.chunks.clear();
  using MergeKind = TensorParallelMerge::Kind;
  const TensorParallelMerge& m = rule.merge;
  if (m.kind == MergeKind::kReplicated) {
    for (std::size_t t = 1; t < slices.size(); ++t) {
      if (same_tensor_values(*slices[t], first)) continue;
      if (rule.averaged)
        fail(ErrorCode::kUnimplemented, path + ": '" + name + "' (parameter_to_average_patterns) differs between " +
                                            "tensor-parallel ranks 0 and " + std::to_string(t) +
                                            ": DeepSpeed's converter writes their mean, a value computed, not "
                                            "copied; ckptconv merges only equal replicas of it");
      fail_data_loss(path + ": '" + name + "' (tp_replicated_parameter_patterns) differs between tensor-parallel " +
                     "ranks 0 and " + std::to_string(t));
    }
    out.chunks = first.chunks;
  } else {
    const std::size_t d = m.kind == MergeKind::kTwoSubParams ? 0 : std::size_t(m.cat_dim);
    if (first.shape.size() <= d)
      fail_data_loss(path + ": '" + name + "' has shape " + shape_str(first.shape) + ", no dimension " +
                     std::to_string(d) + " to merge its tensor-parallel slices on");
    for (std::size_t t = 1; t < slices.size(); ++t)
      for (std::size_t k = 0; k < first.shape.size(); ++k)
        if (k != d && slices[t]->shape[k] != first.shape[k])
          fail_data_loss(path + ": '" + name + "' is " + shape_str(slices[t]->shape) + " on tensor-parallel rank " +
                         std::to_string(t) + ", " + shape_str(first.shape) + " on rank 0: not slices along dimension " +
                         std::to_string(d));
    int64_t total = 0, half_total = 0;
    for (const TensorEntry* s : slices) {
      total += s->shape[d];
      half_total += (s->shape[d] + 1) / 2;  // torch.chunk(2): the first half has ceil(n/2)
    }
    out.shape[d] = total;
    int64_t base = 0, base2 = half_total;
    for (const TensorEntry* s : slices) {
      const int64_t n = s->shape[d];
      if (m.kind == MergeKind::kCat) {
        append_cut(out, *s, d, 0, n, base);
        base += n;
      } else {  // [rank 0's first half, rank 1's, ..., rank 0's second half, rank 1's, ...]
        const int64_t h = (n + 1) / 2;
        append_cut(out, *s, d, 0, h, base);
        append_cut(out, *s, d, h, n, base2 - h);
        base += h;
        base2 += n - h;
      }
    }
  }
  if (m.vocabulary) {  // param[:original_vocab_size, :]
    const int64_t v = *rules.original_vocab_size_;
    if (out.shape.size() != 2 || out.shape[0] < v)
      fail_data_loss(path + ": vocabulary parameter '" + name + "' merges to " + shape_str(out.shape) +
                     ", not a 2-D tensor of at least original_vocab_size " + std::to_string(v) + " rows");
    TensorEntry whole = out;
    out.chunks.clear();
    append_cut(out, whole, 0, 0, v, 0);
    out.shape[0] = v;
  }
  return out;
}

}  // namespace ckpt::zero
