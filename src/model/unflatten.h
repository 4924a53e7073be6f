// Rebuilds a nested state dict from flat keys and their object paths, with
// the semantics of torch.distributed.checkpoint._traverse.set_element: a str
// path element indexes a dict (created on demand), an int one a list
// (extended with None up to the index).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "pickle/value.h"

namespace ckpt {

class Unflattener {
 public:
  Unflattener() : root_(pickle::Value::dict()) {}
  // DataLoss when the path is empty, an element is neither str nor int, or
  // it conflicts with what earlier paths built.
  void set(const std::vector<pickle::ValuePtr>& path, pickle::ValuePtr value);
  pickle::ValuePtr root() const { return root_; }

 private:
  pickle::ValuePtr& slot_for(pickle::Value& container, const pickle::Value& key);

  pickle::ValuePtr root_;
  // Each dict this built: key -> its entry's position (entries are only appended).
  std::unordered_map<const pickle::Value*, std::unordered_map<std::string, std::size_t>> keys_;
  std::vector<pickle::ValuePtr> made_;  // the containers set() made, kept alive so their addresses stay theirs
};

}  // namespace ckpt
