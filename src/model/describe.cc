#include "model/describe.h"

#include "core/checked.h"
#include "core/error.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <optional>
#include <set>
#include <vector>

#include "core/units.h"
#include "model/tree_walk.h"
#include "model/value_json.h"

namespace ckpt {

namespace {
uint64_t total_bytes(const CheckpointModel& model) {
  uint64_t total = 0;
  for (const auto& t : model.tensors) total = saturating_add(total, t.nbytes());
  return total;
}

// The rows each rank holds, in the slice notation of --dry-run:
// "r0[0:4] r1[4:8]" ("r0[]" for a 0-dim tensor).
std::string ranks_of(const TensorEntry& t) {
  std::string s;
  for (const auto& c : t.chunks) {
    if (c.rank < 0) continue;
    if (!s.empty()) s += " ";
    s += 'r';
    s += std::to_string(c.rank);
    s += c.sizes.empty() ? "[]" : box_str({c.offsets[0]}, {c.sizes[0]});
  }
  return s;
}
// The root's dict (an OrderedDict is a built object around one), or null.
const pickle::Value* top_dict(const CheckpointModel& model) {
  const pickle::Value* top = model.root.get();
  if (top && top->is(pickle::Kind::kBuilt) && top->object) top = top->object.get();
  return top && top->is(pickle::Kind::kDict) ? top : nullptr;
}

// "1,234,567".
std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The model's parameter count, as `sum(p.numel() for p in model.state_dict().values())`
// counts it (buffers included): the tensors under a top-level "model" entry,
// or every tensor of a plain state dict (one with no "optim"/"optimizer"
// entry). Nothing when the checkpoint holds no model (--only optim).
std::optional<std::pair<uint64_t, std::size_t>> model_parameters(const CheckpointModel& model) {
  const pickle::Value* top = top_dict(model);
  bool nested = top && top->get("model");
  // Megatron's stored view keeps the model's modules at the top, beside the
  // optimizer and the training loop's state.
  bool megatron = !nested && model.info.kind == SourceKind::kMegatron;
  if (!nested && !megatron && !holds_weights_only(model)) return std::nullopt;
  static const std::set<std::string> kTrainingLoop = {"optimizer",          "optim",
                                                      "rng_state",          "args",
                                                      "iteration",          "opt_param_scheduler",
                                                      "checkpoint_version", "num_floating_point_operations_so_far"};
  uint64_t numel = 0;
  std::size_t tensors = 0;
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    if (!leaf.tensor || (nested && leaf.path.rfind("model.", 0) != 0)) return;
    if (megatron && kTrainingLoop.count(leaf.path.substr(0, leaf.path.find('.')))) return;
    const TensorEntry& t = model.tensors[*leaf.tensor];
    // A float4_e2m1fn_x2 element is a byte holding two parameters.
    numel += t.numel() * (t.dtype == DType::kFloat4E2M1FNx2 ? 2 : 1);
    ++tensors;
  });
  if (tensors == 0) return std::nullopt;
  return std::make_pair(numel, tensors);
}
}  // namespace

bool holds_weights_only(const CheckpointModel& model) {
  static const std::set<std::string> kTraining = {"model",        "optim",        "optimizer",    "state",
                                                  "param_groups", "lr_scheduler", "client_state", "global_steps"};
  const pickle::Value* top = top_dict(model);
  if (!top) return false;
  for (const auto& [key, value] : top->entries)
    if (!key->is(pickle::Kind::kStr) || kTraining.count(key->text)) return false;
  return true;
}

void describe_model(const CheckpointModel& model, std::ostream& out) {
  out << model.source << ": " << model.format() << ", " << model.tensors.size() << " tensors, "
      << human_bytes(total_bytes(model)) << "\n";
  if (auto params = model_parameters(model))
    out << "  parameters: " << grouped(params->first) << " in " << params->second << " model tensors\n";
  // Facts can hold text read from the file (an HDF5 attribute): escaped, so
  // a damaged byte cannot make the output invalid UTF-8.
  for (const auto& [k, v] : model.facts) out << "  " << printable_text(k) << ": " << printable_text(v) << "\n";
  if (const auto& p = model.info.parallel)
    out << "  parallelism: data " << p->data << ", pipeline " << p->pipeline << ", tensor " << p->tensor << ", expert "
        << p->expert << "\n";
  std::size_t width = 4;
  walk_leaves(*model.root, [&](const Leaf& leaf) { width = std::max(width, leaf.path.size()); });
  width = std::min<std::size_t>(width, 72);
  // As wide as the longest dtype name here (float4_e2m1fn_x2 is 16), so the
  // shape column stays aligned.
  std::size_t dtype_width = 9;
  for (const TensorEntry& t : model.tensors) dtype_width = std::max(dtype_width, dtype_name(t.dtype).size());
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    out << std::left << std::setw(static_cast<int>(width)) << (leaf.path.empty() ? "<root>" : leaf.path) << "  ";
    if (leaf.tensor) {
      const TensorEntry& t = model.tensors[*leaf.tensor];
      out << std::setw(static_cast<int>(dtype_width)) << dtype_name(t.dtype) << " " << std::setw(14)
          << shape_str(t.shape) << " " << std::setw(10) << human_bytes(t.nbytes());
      if (!t.sharding.empty())
        out << " " << t.sharding;
      else if (t.storage != StorageKind::kTensor)
        out << " " << storage_kind_name(t.storage);
      if (t.chunks.size() > 1 || ranks_of(t).size()) out << " chunks=" << t.chunks.size();
      std::string r = ranks_of(t);
      if (!r.empty()) out << " rows " << r;
    } else {
      out << "= " << leaf.value->repr(3, 8);
    }
    out << "\n";
  });
}

void describe_plan(const CheckpointModel& model, const std::string& output, bool detailed, std::ostream& out) {
  uint64_t read = 0, written = 0, casts = 0;
  std::size_t chunks = 0;
  std::set<std::string> files;
  std::vector<std::pair<uint64_t, std::string>> sizes;  // output bytes, line, for the largest
  out << "plan: " << model.source << " -> " << output << "\n";
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    if (!leaf.tensor) return;
    const TensorEntry& t = model.tensors[*leaf.tensor];
    std::string line = leaf.path + "  " + std::string(dtype_name(t.dtype));
    if (t.output_dtype() != t.dtype) line += "->" + std::string(dtype_name(t.output_dtype()));
    line += ' ';
    line += shape_str(t.shape);
    line += ' ';
    line += human_bytes(t.output_nbytes());
    std::size_t used = 0;
    for (const auto& c : t.chunks) {
      if (c.numel() == 0) continue;
      ++used;
      files.insert(c.file.substr(0, c.file.find('[')));  // "FILE[off:+len]" for a slice of a file
    }
    if (detailed) {
      out << "  " << line << " from " << used << " chunk(s)\n";
      for (const auto& c : t.chunks)
        if (c.numel() > 0)
          out << "      " << box_str(c.offsets, c.sizes) << " <- "
              << (c.rank >= 0 ? "rank " + std::to_string(c.rank) + " " : "") << c.file << "\n";
    }
    sizes.emplace_back(t.output_nbytes(), line);
    chunks += used;
    casts += t.output_dtype() != t.dtype ? 1 : 0;
    read += t.nbytes();
    written += t.output_nbytes();
  });
  if (!detailed) {
    out << "  " << sizes.size() << " tensors from " << chunks << " chunks in " << files.size() << " file(s)";
    if (casts) out << ", " << casts << " cast";
    out << "\n";
    std::stable_sort(sizes.begin(), sizes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::size_t shown = std::min<std::size_t>(sizes.size(), 5);
    if (shown) out << "  largest:\n";
    for (std::size_t i = 0; i < shown; ++i) out << "    " << sizes[i].second << "\n";
  }
  out << "total: " << model.tensors.size() << " tensors, read " << human_bytes(read) << ", write "
      << human_bytes(written) << " of tensor data\n";
  if (!detailed) out << "(-v lists every tensor and the source chunks it is read from)\n";
}

nlohmann::ordered_json model_to_json(const CheckpointModel& model) {
  nlohmann::ordered_json j;
  // "schema_version" as validate and diff name it; "schema" kept for v1 consumers.
  j["schema_version"] = 1;
  j["schema"] = 1;
  j["source"] = model.source;
  j["format"] = model.format();
  nlohmann::ordered_json facts = nlohmann::ordered_json::object();
  for (const auto& [k, v] : model.facts) facts[printable_text(k)] = printable_text(v);
  j["facts"] = facts;
  if (const auto& p = model.info.parallel)
    j["parallelism"] = {{"data", p->data}, {"pipeline", p->pipeline}, {"tensor", p->tensor}, {"expert", p->expert}};
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array(), values = nlohmann::ordered_json::array();
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    if (!leaf.tensor) {
      values.push_back({{"path", leaf.path}, {"value", value_to_json(*leaf.value)}});
      return;
    }
    const TensorEntry& t = model.tensors[*leaf.tensor];
    nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
    for (const auto& c : t.chunks)
      chunks.push_back({{"offsets", c.offsets}, {"sizes", c.sizes}, {"file", c.file}, {"rank", c.rank}});
    tensors.push_back({{"path", leaf.path},
                       {"dtype", dtype_name(t.dtype)},
                       {"shape", t.shape},
                       {"bytes", t.nbytes()},
                       {"stored_as", storage_kind_name(t.storage)},
                       {"chunks", chunks}});
    if (!t.sharding.empty()) tensors.back()["sharding"] = t.sharding;
  });
  j["tensors"] = tensors;
  j["values"] = values;
  j["totals"] = {{"tensors", model.tensors.size()}, {"bytes", total_bytes(model)}};
  return j;
}

}  // namespace ckpt
