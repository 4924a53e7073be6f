#include "formats/fsdp_ranks/rank_merge.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <unordered_set>

#include "core/error.h"
#include "core/problems.h"
#include "model/tensor_compare.h"
#include "model/tree_walk.h"

namespace ckpt::fsdp_ranks {
namespace {

using pickle::Kind;
using pickle::Value;

constexpr int kMaxDepth = 512;

std::string describe_tensor(const TensorEntry& t) {
  return std::string(storage_kind_name(t.storage)) + " " + std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape);
}

bool same_scalar(const Value& a, const Value& b) {
  if (a.kind != b.kind || a.bool_value != b.bool_value || a.int_value != b.int_value || a.text != b.text ||
      a.name != b.name || a.bytearray != b.bytearray || a.ordered != b.ordered || a.newobj != b.newobj)
    return false;
  // Bitwise, so that NaN equals NaN and -0.0 differs from 0.0.
  return std::memcmp(&a.float_value, &b.float_value, sizeof(double)) == 0;
}

class RankTreeMerger {
 public:
  RankTreeMerger(CheckpointModel& base, const std::string& base_file, const CheckpointModel& other,
                 const std::string& other_file, int other_rank, ProblemSink* sink)
      : base_(base),
        other_(other),
        base_file_(base_file),
        other_file_(other_file),
        other_rank_(other_rank),
        sink_(sink) {}

  // Each difference is reported (or thrown without a sink); the subtree
  // where it is found is not merged further.
  void merge(const Value& a, const Value& b, const std::string& path, int depth) {
    if (depth > kMaxDepth)
      fail_data_loss("'" + path + "' is nested deeper than " + std::to_string(kMaxDepth) + " levels");
    auto ia = tensor_ref_index(a), ib = tensor_ref_index(b);
    if (ia || ib) {
      if (!ia || !ib) return differ(path, ia ? "a tensor" : a.repr(2), ib ? "a tensor" : b.repr(2));
      merge_tensor(*ia, *ib, path);
      return;
    }
    if (!same_scalar(a, b)) return differ(path, a.repr(2), b.repr(2));
    if (a.items.size() != b.items.size())
      return differ(path, std::to_string(a.items.size()) + " elements", std::to_string(b.items.size()) + " elements");
    for (std::size_t i = 0; i < a.items.size(); ++i)
      merge(*a.items[i], *b.items[i], join_path(path, std::to_string(i)), depth + 1);
    if (!same_keys(a, b, path)) return;
    merge_entries(a, b, path, depth);
    merge_child(a.callable, b.callable, path, depth);
    merge_child(a.args, b.args, path, depth);
    merge_child(a.kwargs, b.kwargs, path, depth);
    merge_child(a.object, b.object, path, depth);
    merge_child(a.state, b.state, path, depth);
    merge_child(a.pid, b.pid, path, depth);
  }

 private:
  void problem(const std::string& path, std::string message) {
    report_or_fail(sink_, {ErrorCode::kDataLoss, std::move(message), other_file_, other_rank_, path});
  }

  void differ(const std::string& path, const std::string& in_base, const std::string& in_other) {
    problem(path, "'" + (path.empty() ? std::string("<root>") : path) + "' differs between ranks: " + in_base + " in " +
                      base_file_ + ", " + in_other + " in " + other_file_);
  }

  void merge_child(const pickle::ValuePtr& a, const pickle::ValuePtr& b, const std::string& path, int depth) {
    if (!a && !b) return;
    if (!a || !b) return differ(path, a ? a->repr(2) : "nothing", b ? b->repr(2) : "nothing");
    merge(*a, *b, path, depth + 1);
  }

  void merge_entries(const Value& a, const Value& b, const std::string& path, int depth) {
    for (std::size_t i = 0; i < a.entries.size(); ++i)
      merge(*a.entries[i].second, *b.entries[i].second, join_path(path, path_component(*a.entries[i].first)),
            depth + 1);
  }

  // False after naming each key one side has and the other lacks (or the
  // first one out of order).
  bool same_keys(const Value& a, const Value& b, const std::string& path) {
    auto keys = [](const Value& v) {
      std::vector<std::string> out;
      for (const auto& [k, unused] : v.entries) out.push_back(path_component(*k));
      return out;
    };
    bool same = a.entries.size() == b.entries.size();
    for (std::size_t i = 0; same && i < a.entries.size(); ++i)
      same = a.entries[i].first->kind == b.entries[i].first->kind &&
             path_component(*a.entries[i].first) == path_component(*b.entries[i].first);
    if (same) return true;
    auto ka = keys(a), kb = keys(b);
    bool named = false;
    for (const auto& k : ka)
      if (std::find(kb.begin(), kb.end(), k) == kb.end()) {
        const std::string where = join_path(path, k);
        problem(where, "'" + where + "' is in " + base_file_ + " but not in " + other_file_);
        named = true;
      }
    for (const auto& k : kb)
      if (std::find(ka.begin(), ka.end(), k) == ka.end()) {
        const std::string where = join_path(path, k);
        problem(where, "'" + where + "' is in " + other_file_ + " but not in " + base_file_);
        named = true;
      }
    if (!named)
      problem(path, "the keys of '" + (path.empty() ? std::string("<root>") : path) + "' are in a different order in " +
                        base_file_ + " and " + other_file_);
    return false;
  }

  void merge_tensor(std::size_t ia, std::size_t ib, const std::string& path) {
    if (!merged_.insert(ia).second) return;  // one tensor reached twice through the pickle memo
    TensorEntry& a = base_.tensors.at(ia);
    const TensorEntry& b = other_.tensors.at(ib);
    if (a.storage != b.storage || a.dtype != b.dtype || a.shape != b.shape)
      return differ(path, describe_tensor(a), describe_tensor(b));
    if (a.is_sharded()) {
      a.chunks.insert(a.chunks.end(), b.chunks.begin(), b.chunks.end());
    } else if (!same_tensor_bytes(a, b)) {
      problem(path, "'" + path +
                        "' is a plain (unsharded) tensor that every rank should hold alike, but its bytes in " +
                        base_file_ + " and " + other_file_ + " differ");
    }
  }

  CheckpointModel& base_;
  const CheckpointModel& other_;
  const std::string& base_file_;
  const std::string& other_file_;
  int other_rank_;
  ProblemSink* sink_;
  std::unordered_set<std::size_t> merged_;
};

}  // namespace

void merge_rank_model(CheckpointModel& base, const std::string& base_file, const CheckpointModel& other,
                      const std::string& other_file, int other_rank, ProblemSink* sink) {
  RankTreeMerger(base, base_file, other, other_file, other_rank, sink).merge(*base.root, *other.root, "", 0);
}

std::size_t drop_replica_chunks(CheckpointModel& model) {
  std::size_t dropped = 0;
  for (auto& t : model.tensors) {
    if (t.storage != StorageKind::kDTensor) continue;
    std::set<std::pair<Shape, Shape>> seen;
    std::vector<TensorChunk> kept;
    // Lowest rank first: the first replica group is kept.
    std::stable_sort(t.chunks.begin(), t.chunks.end(),
                     [](const TensorChunk& x, const TensorChunk& y) { return x.rank < y.rank; });
    for (auto& c : t.chunks) {
      if (c.numel() != 0 && !seen.insert({c.offsets, c.sizes}).second) {
        ++dropped;
        continue;
      }
      kept.push_back(std::move(c));
    }
    t.chunks = std::move(kept);
  }
  return dropped;
}

}  // namespace ckpt::fsdp_ranks
