#include "diff/checkpoint_diff.h"

#include <unordered_map>

#include "core/error.h"
#include "diff/element_values.h"
#include "model/tree_walk.h"
#include "model/value_json.h"

namespace ckpt {
namespace {

struct LeafRef {
  std::string path;
  std::string structure;
  const pickle::Value* value;
  std::optional<std::size_t> tensor;
};

std::vector<LeafRef> leaves_of(const CheckpointModel& m) {
  std::vector<LeafRef> out;
  if (m.root) walk_leaves(*m.root, [&](const Leaf& l) { out.push_back({l.path, l.structure, l.value, l.tensor}); });
  return out;
}

// The leaves of A and B matched by path. A path that occurs twice in one
// tree (a dict key holding a dot, e.g. {"a.b": x, "a": {"b": y}}) matches
// by order of occurrence.
struct Matching {
  std::vector<LeafRef> a, b;
  std::vector<std::pair<std::size_t, std::size_t>> both;  // indices into a, b
  std::vector<std::size_t> only_a, only_b;
};

Matching match_leaves(const CheckpointModel& ma, const CheckpointModel& mb) {
  Matching m{leaves_of(ma), leaves_of(mb), {}, {}, {}};
  std::unordered_map<std::string, std::vector<std::size_t>> in_b;
  for (std::size_t j = m.b.size(); j-- > 0;) in_b[m.b[j].path].push_back(j);  // popped from the back: first first
  std::vector<bool> b_used(m.b.size(), false);
  for (std::size_t i = 0; i < m.a.size(); ++i) {
    auto it = in_b.find(m.a[i].path);
    if (it == in_b.end() || it->second.empty()) {
      m.only_a.push_back(i);
      continue;
    }
    std::size_t j = it->second.back();
    it->second.pop_back();
    b_used[j] = true;
    m.both.emplace_back(i, j);
  }
  for (std::size_t j = 0; j < m.b.size(); ++j)
    if (!b_used[j]) m.only_b.push_back(j);
  return m;
}

nlohmann::ordered_json tensor_as_json(const TensorEntry& t) {
  return {{"__tensor__", {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}}}};
}

nlohmann::ordered_json leaf_json(const CheckpointModel& m, const LeafRef& l) {
  return l.tensor ? tensor_as_json(m.tensors.at(*l.tensor)) : value_to_json(*l.value);
}

// A BytesIO on one side, the same bytes on the other: what consolidate
// writes for a DCP item saved from a BytesIO (torchtitan's train_state).
bool bytes_io_and_its_bytes(const pickle::Value& a, const pickle::Value& b) {
  return a.is(pickle::Kind::kBytes) && b.is(pickle::Kind::kBytes) && a.bytes_io != b.bytes_io && a.text == b.text;
}

}  // namespace

bool TensorDiff::values_comparable() const {
  return !shape_differs() && packed_values(dtype_a) == packed_values(dtype_b);
}

bool TensorDiff::equal(const DiffOptions& options) const {
  if (shape_differs()) return false;
  if (dtype_differs() && !options.ignore_dtype) return false;
  return values && values->mismatched == 0;
}

std::size_t DiffReport::tensors_differing() const {
  std::size_t n = 0;
  for (const auto& t : tensors) n += !t.equal(options);
  return n;
}

bool DiffReport::equal() const {
  return only_in_a.empty() && only_in_b.empty() && values.empty() && structure.empty() && tensors_differing() == 0;
}

uint64_t diff_read_bytes(const CheckpointModel& a, const CheckpointModel& b) {
  Matching m = match_leaves(a, b);
  uint64_t total = 0;
  for (auto [i, j] : m.both) {
    if (!m.a[i].tensor || !m.b[j].tensor) continue;
    const TensorEntry& ta = a.tensors.at(*m.a[i].tensor);
    const TensorEntry& tb = b.tensors.at(*m.b[j].tensor);
    if (ta.shape == tb.shape) total += ta.nbytes() + tb.nbytes();
  }
  return total;
}

DiffReport diff_models(const CheckpointModel& a, const CheckpointModel& b, const DiffOptions& options) {
  DiffReport report;
  report.a = {a.source, a.format()};
  report.b = {b.source, b.format()};
  report.options = options;
  Matching m = match_leaves(a, b);
  for (std::size_t i : m.only_a) report.only_in_a.push_back(m.a[i].path);
  for (std::size_t j : m.only_b) report.only_in_b.push_back(m.b[j].path);
  bool nesting_known = !a.info.flat_keys && !b.info.flat_keys;
  for (auto [i, j] : m.both) {
    const LeafRef& la = m.a[i];
    const LeafRef& lb = m.b[j];
    if (nesting_known && la.structure != lb.structure)
      report.structure.push_back({la.path, la.structure, lb.structure});
    if (la.tensor && lb.tensor) {
      const TensorEntry& ta = a.tensors.at(*la.tensor);
      const TensorEntry& tb = b.tensors.at(*lb.tensor);
      TensorDiff d{la.path, ta.dtype, tb.dtype, ta.shape, tb.shape, std::nullopt};
      if (d.values_comparable())
        d.values = with_context("tensor '" + la.path + "'",
                                [&] { return compare_tensor_values(ta, tb, options.tolerance, options.stream); });
      report.tensors.push_back(std::move(d));
      continue;
    }
    if (!la.tensor && !lb.tensor) ++report.values_compared;
    if (!options.strict && !la.tensor && !lb.tensor && bytes_io_and_its_bytes(*la.value, *lb.value)) {
      ++report.bytes_io_as_bytes;
      continue;
    }
    auto ja = leaf_json(a, la), jb = leaf_json(b, lb);
    if (la.tensor || lb.tensor || ja != jb) report.values.push_back({la.path, std::move(ja), std::move(jb)});
  }
  return report;
}

}  // namespace ckpt
