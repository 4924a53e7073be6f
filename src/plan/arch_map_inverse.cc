#include "plan/arch_map_inverse.h"

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "model/tensor_compare.h"
#include "model/tree_walk.h"
#include "model/validate.h"

namespace ckpt {
namespace {

using Indices = std::map<std::string, std::string>;

// Calls `each` with every combination of the placeholders `names` takes,
// each from 0 to the count its `indices` expression gives.
void for_each_index(const std::vector<std::string>& names, const ArchMap& map,
                    const std::function<int64_t(const std::string&)>& eval,
                    const std::function<void(const Indices&)>& each) {
  Indices values;
  std::function<void(std::size_t)> walk = [&](std::size_t k) {
    if (k == names.size()) return each(values);
    const int64_t count = eval(map.indices.at(names[k]));
    for (int64_t i = 0; i < count; ++i) {
      values[names[k]] = std::to_string(i);
      walk(k + 1);
    }
  };
  walk(0);
}

std::string dims_of(const std::vector<std::string>& dims, const Shape& values) {
  std::string out;
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + dims[i] + " = " + std::to_string(values[i]);
  return out;
}

// A tied tensor the folder holds anyway (an lm_head that
// model.state_dict() lists beside the embedding it is): true when another
// tensor of the same dtype and shape holds the same bytes. Such a folder's
// reader, told to tie, takes the other; one whose copy differs is a model
// trained untied under a config that ties, and its output layer would be
// lost. Read in blocks of about 1 MiB (same_tensor_values), and only for
// folders that hold the copy.
bool holds_a_copy(const CheckpointModel& model, std::size_t tied, const std::map<std::string, std::size_t>& by_name) {
  const TensorEntry& t = model.tensors.at(tied);
  int names_of_tied = 0;
  for (const auto& [name, index] : by_name) {
    if (index == tied && ++names_of_tied > 1) return true;  // the reader's alias (a folder that ties): the same tensor
    const TensorEntry& other = model.tensors.at(index);
    if (index == tied || other.dtype != t.dtype || other.shape != t.shape) continue;
    if (same_tensor_values(t, other)) return true;
  }
  return false;
}

}  // namespace

std::vector<RowRun> half_to_interleaved_runs(int64_t rows, int64_t head_dim) {
  std::vector<RowRun> runs;
  for (int64_t h = 0; h < rows; h += head_dim)
    for (int64_t i = 0; i < head_dim / 2; ++i) runs.push_back({h + i, 2, head_dim / 2});
  return runs;
}

TensorEntry concat_rows(const std::vector<RowPart>& parts, const std::string& name) {
  if (parts.empty()) fail_invalid("tensor '" + name + "': nothing to concatenate");
  TensorEntry out = *parts.front().source;
  out.name = name;
  out.chunks.clear();
  int64_t base = 0;
  for (const RowPart& p : parts) {
    const TensorEntry& s = *p.source;
    Shape rest(s.shape.begin() + (s.shape.empty() ? 0 : 1), s.shape.end());
    Shape first(out.shape.begin() + (out.shape.empty() ? 0 : 1), out.shape.end());
    if (s.dtype != out.dtype || rest != first || s.shape.empty())
      fail(ErrorCode::kDataLoss, "tensor '" + name + "': its parts '" + parts.front().source->name + "' " +
                                     std::string(dtype_name(out.dtype)) + " " + shape_str(out.shape) + " and '" +
                                     s.name + "' " + std::string(dtype_name(s.dtype)) + " " + shape_str(s.shape) +
                                     " differ in dtype or in their other dimensions");
    TensorEntry piece = gather_rows(s, {p.run}, name);
    for (TensorChunk& c : piece.chunks) {
      c.offsets[0] += base;
      out.chunks.push_back(std::move(c));
    }
    base += p.run.count;
  }
  out.shape[0] = base;
  return out;
}

TensorEntry pad_rows(const TensorEntry& t, int64_t rows, const std::string& name) {
  if (t.shape.empty() || rows < t.shape[0])
    fail_invalid("tensor '" + t.name + "': cannot pad to " + std::to_string(rows) + " rows");
  TensorEntry out = gather_rows(t, {{0, t.shape[0], 1}}, name);
  if (rows == t.shape[0]) return out;
  TensorChunk z;
  z.offsets = Shape(t.shape.size(), 0);
  z.offsets[0] = t.shape[0];
  z.sizes = t.shape;
  z.sizes[0] = rows - t.shape[0];
  z.strides = contiguous_strides(z.sizes);
  z.storage = make_memory_source(std::string(shape_numel(z.sizes) * dtype_size(t.dtype), '\0'), "<padding>");
  z.file = "<padding>";
  out.chunks.push_back(std::move(z));
  out.shape[0] = rows;
  return out;
}

namespace {

// The config's fields with the indices `at` captured, for a stack rule's
// index expression ("E", "experts - 1 - E").
ConfigFields with_indices(const ConfigFields& config, const Indices& at) {
  ConfigFields with = config;
  for (const auto& [k, v] : at) with[k] = std::stoll(v);
  return with;
}

// A tensor of the folder no rule took, as a message: where a rule's target
// pattern names it with an index past the config's count (an expert more
// than num_local_experts, a layer more than num_hidden_layers), that index
// and the config field; else what a tensor of no rule is.
std::string unused_tensor_message(const std::string& name, const CheckpointModel& model, const ArchMap& map,
                                  const std::function<int64_t(const std::string&)>& eval,
                                  const std::string& config_name, const std::string& where) {
  for (const MapRule& rule : map.rules)
    for (const std::string& to : rule.to) {
      auto at = match_pattern(to, name);
      if (!at) continue;
      for (const auto& [index, value] : *at) {
        const std::string& count = map.indices.at(index);
        if (value.size() > 18 || std::stoll(value) >= eval(count))
          return "tensor '" + name + "' of " + model.source + " has " + index + " = " + value + ", past " + count +
                 " = " + std::to_string(eval(count)) + " in " + config_name + " (" + where +
                 "): the folder holds more than the config counts";
      }
    }
  return "tensor '" + name + "' of " + model.source + " is no target of " + where +
         ": the way back writes the model the map describes and nothing else (an optimizer's state does not "
         "travel back; a tensor of another model has no place in it)";
}

}  // namespace

bool holds_map_targets(const CheckpointModel& model, const ArchMap& map, const ConfigFields& config,
                       const std::string& config_name) {
  std::set<std::string> names;
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    if (leaf.tensor) names.insert(leaf.path);
  });
  for (const MapRule& rule : map.rules) {
    if (rule.optional || (!rule.unless.empty() && evaluate_map_expression(rule.unless, map, config, config_name)))
      continue;
    for (const std::string& to : rule.to) {
      Indices zeros;
      for (const std::string& n : pattern_indices(to)) zeros.emplace(n, "0");  // each index once: emplace sets it
      if (!names.count(substitute_indices(to, zeros))) return false;
    }
  }
  return true;
}

CheckpointModel apply_arch_map_back(const CheckpointModel& model, const ArchMap& map, const ConfigFields& config,
                                    const std::string& config_name, int64_t pad_multiple) {
  if (pad_multiple < 1) fail_invalid("the vocabulary's padding multiple must be at least 1");
  auto eval = [&](const std::string& text) { return evaluate_map_expression(text, map, config, config_name); };
  const std::string where = "map " + map.name + " (" + map.origin + "), the way back";
  std::map<std::string, std::size_t> by_name;  // the model's tensors by name
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    if (leaf.tensor) by_name.emplace(leaf.path, *leaf.tensor);
  });
  std::set<std::string> used;
  // stack's inverse: per stacked tensor of the folder, the indices of its
  // leading dim taken so far (each exactly once, all of them by the end).
  std::map<std::string, std::set<int64_t>> unstacked;

  CheckpointModel out;
  out.info = model.info;
  out.info.flat_layout.reset();  // new names: flattened as dcp.save would
  out.source = model.source;
  out.facts = model.facts;
  std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>> entries;
  auto add = [&](TensorEntry t) {
    entries.emplace_back(pickle::Value::str(t.name), make_tensor_ref(out.tensors.size()));
    out.tensors.push_back(std::move(t));
  };
  // The folder's tensor `pattern` names at `at`, with the shape the config
  // gives it; null when it is missing and the rule optional.
  auto target = [&](const MapRule& rule, const std::string& pattern, const std::vector<std::string>& dims,
                    const std::string& source_name, const Indices& at) -> const TensorEntry* {
    const std::string name = substitute_indices(pattern, at);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (rule.optional) return nullptr;
      std::string indices;  // the missing tensor's own (a fused tensor is no one expert's)
      for (const auto& k : pattern_indices(pattern))
        indices += (indices.empty() ? " (" : ", ") + k + " = " + at.at(k) + " of " + map.indices.at(k) + " = " +
                   std::to_string(eval(map.indices.at(k)));
      fail(ErrorCode::kNotFound, model.source + ": tensor '" + name + "' is missing: " + where + " needs it for '" +
                                     source_name + "'" + (indices.empty() ? "" : indices + " in " + config_name + ")"));
    }
    const TensorEntry& t = model.tensors.at(it->second);
    Shape expected;
    for (const auto& d : dims) expected.push_back(eval(d));
    if (t.shape != expected)
      fail(ErrorCode::kDataLoss, "tensor '" + name + "' (for '" + source_name + "') has shape " + shape_str(t.shape) +
                                     " but " + config_name + " gives (" + dims_of(dims, expected) + ")");
    used.insert(name);
    return &t;
  };

  for (const MapRule& rule : map.rules) {
    if (!rule.unless.empty() && eval(rule.unless) != 0) {
      // A tied output layer: none to write. A folder may still name it
      // (model.state_dict() holds lm_head.weight as the embedding itself).
      for_each_index(pattern_indices(rule.from[0]), map, eval, [&](const Indices& at) {
        for (const auto& to : rule.to) {
          const std::string name = substitute_indices(to, at);
          auto it = by_name.find(name);
          if (it == by_name.end()) continue;
          used.insert(name);
          if (!holds_a_copy(model, it->second, by_name))
            fail(ErrorCode::kDataLoss, model.source + ": tensor '" + name +
                                           "' equals no other tensor of its shape, "
                                           "but " +
                                           rule.unless + " in " + config_name + " ties it to one (" + where +
                                           "): an untied model under a tying config; fix the config, or remove '" +
                                           name + "' to take the tie as transformers does");
          log::info("'" + name + "' left out: " + rule.unless + " in " + config_name + " (" + where + ")");
        }
      });
      continue;
    }
    for_each_index(pattern_indices(rule.from[0]), map, eval, [&](const Indices& at) {
      const std::string source_name = substitute_indices(rule.from[0], at);
      if (rule.op == MapRule::Op::kUnstack) {
        // unstack's inverse: the targets of every index, stacked on a new
        // leading dim (a tensor per expert into the framework's fused one).
        const int64_t count = eval(map.indices.at(rule.unstack));
        std::vector<const TensorEntry*> slices;
        for (int64_t i = 0; i < count; ++i) {
          Indices with = at;
          with[rule.unstack] = std::to_string(i);
          const TensorEntry* t = target(rule, rule.to[0], rule.shapes[0], source_name, with);
          if (!t) return;
          if (!slices.empty() && t->dtype != slices[0]->dtype)
            fail(ErrorCode::kDataLoss, "tensor '" + t->name + "' is " + std::string(dtype_name(t->dtype)) + ", '" +
                                           slices[0]->name + "' " + std::string(dtype_name(slices[0]->dtype)) +
                                           ": they do not stack into '" + source_name + "'");
          slices.push_back(t);
        }
        if (slices.empty()) return;
        TensorEntry stacked = *slices[0];
        stacked.name = source_name;
        stacked.chunks.clear();
        stacked.shape.insert(stacked.shape.begin(), count);
        for (int64_t i = 0; i < count; ++i) place_slice(stacked, *slices[static_cast<std::size_t>(i)], i);
        return add(std::move(stacked));
      }
      std::vector<const TensorEntry*> targets;
      for (std::size_t i = 0; i < rule.to.size(); ++i) {
        const TensorEntry* t = target(rule, rule.to[i], rule.shapes[i], source_name, at);
        if (!t) return;
        targets.push_back(t);
      }
      switch (rule.op) {
        case MapRule::Op::kRename: {
          TensorEntry t = *targets[0];
          t.name = source_name;
          return add(std::move(t));
        }
        case MapRule::Op::kSplit: {
          // Block by block: per group, each section's rows of that group.
          const int64_t groups = eval(rule.groups);
          std::vector<RowPart> parts;
          for (int64_t g = 0; g < groups; ++g)
            for (std::size_t i = 0; i < targets.size(); ++i) {
              const int64_t rows = eval(rule.sections[i]);
              if (g == 0 && targets[i]->shape.at(0) != groups * rows)
                fail(ErrorCode::kDataLoss, "tensor '" + targets[i]->name + "' has " +
                                               std::to_string(targets[i]->shape[0]) + " rows, not " + rule.groups +
                                               " x " + rule.sections[i] + " = " + std::to_string(groups * rows) +
                                               " as " + config_name + " gives");
              parts.push_back({targets[i], {g * rows, rows, 1}});
            }
          return add(concat_rows(parts, source_name));
        }
        case MapRule::Op::kUnpad: {
          const int64_t rows = targets[0]->shape.at(0);
          const int64_t padded = (rows + pad_multiple - 1) / pad_multiple * pad_multiple;
          if (padded != rows)
            log::info("'" + source_name + "': the " + std::to_string(rows) + " rows of '" + targets[0]->name +
                      "' and " + std::to_string(padded - rows) + " rows of zeros, padded to " + std::to_string(padded) +
                      " (a multiple of " + std::to_string(pad_multiple) + ")");
          return add(pad_rows(*targets[0], padded, source_name));
        }
        case MapRule::Op::kPermuteRope: {
          const int64_t head_dim = eval(rule.head_dim);
          const int64_t rows = targets[0]->shape.at(0);
          if (head_dim <= 0 || head_dim % 2 != 0 || rows % head_dim != 0)
            fail(ErrorCode::kDataLoss, "tensor '" + targets[0]->name + "' has " + std::to_string(rows) +
                                           " rows, not whole heads of " + rule.head_dim + " = " +
                                           std::to_string(head_dim) + " (an even number) in " + config_name);
          return add(gather_rows(*targets[0], half_to_interleaved_runs(rows, head_dim), source_name));
        }
        case MapRule::Op::kStack: {
          // stack's inverse: this source is one index of the folder's fused
          // tensor (an expert of transformers 5's gate_up_proj), taken once.
          const TensorEntry& fused = *targets[0];
          const int64_t index = evaluate_map_expression(rule.stack, map, with_indices(config, at), config_name);
          if (index < 0 || index >= fused.shape.at(0))
            fail(ErrorCode::kDataLoss, "'" + source_name + "' would be index " + std::to_string(index) + " (" +
                                           rule.stack + ") of '" + fused.name + "', whose " + rule.shapes[0][0] +
                                           " = " + std::to_string(fused.shape[0]) + " in " + config_name);
          if (!unstacked[fused.name].insert(index).second)
            fail(ErrorCode::kUnimplemented, where + ": index " + std::to_string(index) + " of '" + fused.name +
                                                "' would become two tensors (" + rule.stack + ")");
          return add(slice_of(fused, index, source_name));
        }
        case MapRule::Op::kUnstack: break;  // above
      }
    });
  }
  // Every index of a fused tensor became a framework tensor: one left over
  // would be an expert the checkpoint silently lacks.
  for (const auto& [name, taken] : unstacked) {
    const int64_t count = model.tensors.at(by_name.at(name)).shape.at(0);
    for (int64_t i = 0; i < count; ++i)
      if (!taken.count(i))
        fail(ErrorCode::kDataLoss, "tensor '" + name + "': index " + std::to_string(i) + " of its " +
                                       std::to_string(count) + " is no index " + where + " takes");
  }
  for (const auto& [name, index] : by_name)
    if (!used.count(name))
      fail(ErrorCode::kUnimplemented, unused_tensor_message(name, model, map, eval, config_name, where));
  for (const std::string& pattern : map.back_none)
    for_each_index(pattern_indices(pattern), map, eval, [&](const Indices& at) {
      entries.emplace_back(pickle::Value::str(substitute_indices(pattern, at)), pickle::Value::none());
    });
  out.root = pickle::Value::dict(std::move(entries));
  require_valid(out);
  return out;
}

}  // namespace ckpt
