// Walks a model's structure tree down to its leaves: tensor references and
// plain values. Dict keys and list indices form dotted paths
// ("optim.param_groups.0.lr"), the names --keys matches and inspect prints.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt {

struct Leaf {
  std::string path;
  // The containers the path goes through, outermost first, with their key
  // types: "dict[str] > list > dict[int]". Two leaves with one dotted path
  // may differ here ({'a.b': t} vs {'a': {'b': t}}): diff compares both.
  std::string structure;
  const pickle::Value* value;         // the leaf itself
  std::optional<std::size_t> tensor;  // index into CheckpointModel::tensors when a tensor
};

// Visits leaves in tree order (dict insertion order). Containers are dicts,
// lists and tuples; everything else is a leaf.
void walk_leaves(const pickle::Value& root, const std::function<void(const Leaf&)>& visit);

// Outputs that name every entry by its dotted path (DCP, safetensors,
// HDF5, a universal or DCP-HF checkpoint) would keep one of two entries
// whose paths agree ({7: a, '7': b}, or {'a.b': a, 'a': {'b': b}}) and
// drop the other: Unimplemented (exit 3) naming both, for `output`.
void require_distinct_paths(const pickle::Value& root, const std::string& output);

// A path component for a dict key: the string itself, an int in decimal,
// anything else its repr.
std::string path_component(const pickle::Value& key);
std::string join_path(const std::string& parent, const std::string& component);

// The dict of a mapping value: `v` itself, or the dict under BUILD for an
// OrderedDict with attributes (a state_dict() and its `_metadata`).
pickle::ValuePtr mapping_of(const pickle::ValuePtr& v);

// Unimplemented naming the source unless its root is a state dict (a dict):
// "<source>: <layout> holds a state dict (a dict); this file holds a tensor".
void require_state_dict(const CheckpointModel& model, const std::string& layout);

// The value a flat DCP key stands for: `path` (planner_data) followed from
// the model's root. DataLoss naming the key when it leads nowhere.
pickle::ValuePtr value_at_path(const pickle::ValuePtr& root, const std::vector<pickle::ValuePtr>& path,
                               const std::string& key);

}  // namespace ckpt
