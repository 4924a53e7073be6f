#include "check/optimizer_checks.h"

#include <map>
#include <optional>
#include <set>

#include "model/tree_walk.h"

namespace ckpt::check {
namespace {

using pickle::Kind;
using pickle::Value;

// Factored second moments (Adafactor) legitimately differ from the
// parameter's shape; every other torch.optim state tensor has it.
const std::set<std::string> kFactoredState = {"row_var", "col_var", "exp_avg_sq_row", "exp_avg_sq_col"};

const Value* as_dict(const pickle::ValuePtr& v) {
  if (!v) return nullptr;
  if (v->is(Kind::kDict)) return v.get();
  // An OrderedDict with attributes is BUILD over a dict (tree_walk does the same).
  if (v->is(Kind::kBuilt) && v->object && v->object->is(Kind::kDict)) return v->object.get();
  return nullptr;
}

bool is_optimizer_dict(const Value& d) {
  const Value* state = as_dict(d.get("state"));
  auto groups = d.get("param_groups");
  return state && groups && groups->is(Kind::kList);
}

// get_optimizer_state_dict(..., flatten_optimizer_state_dict=True), as
// torchtitan saves it: {"state.<fqn>.<name>": value, "param_groups.<fqn>.<key>": value}.
bool is_flat_optimizer_dict(const Value& d) {
  bool any_state = false;
  for (const auto& [key, value] : d.entries) {
    if (!key->is(Kind::kStr)) return false;
    if (key->text.rfind("state.", 0) == 0)
      any_state = true;
    else if (key->text.rfind("param_groups.", 0) != 0)
      return false;
  }
  return any_state;
}

// "<prefix><fqn>.<last>" -> {fqn, last}; nullopt without both parts.
std::optional<std::pair<std::string, std::string>> split_flat_key(const std::string& key, const std::string& prefix) {
  if (key.rfind(prefix, 0) != 0) return std::nullopt;
  std::size_t dot = key.rfind('.');
  if (dot == std::string::npos || dot <= prefix.size()) return std::nullopt;
  return std::make_pair(key.substr(prefix.size(), dot - prefix.size()), key.substr(dot + 1));
}

// A model tensor by FQN: a flat key ("fc1.weight"), or nested dicts.
std::optional<std::size_t> find_param(const Value& model, const std::string& fqn) {
  if (auto v = model.get(fqn)) return tensor_ref_index(*v);
  for (std::size_t dot = fqn.find('.'); dot != std::string::npos; dot = fqn.find('.', dot + 1)) {
    const Value* child = as_dict(model.get(fqn.substr(0, dot)));
    if (child) return find_param(*child, fqn.substr(dot + 1));
  }
  return std::nullopt;
}

class OptimizerChecker {
 public:
  OptimizerChecker(const CheckpointModel& model, bool complete, ProblemSink& sink)
      : model_(model), complete_(complete), sink_(sink) {}

  void check(const Value& optim, const std::string& path, const Value* params_model) {
    std::map<std::string, int> group_of;  // parameter (FQN or id, as text) -> its group
    auto groups = optim.get("param_groups");
    for (std::size_t g = 0; g < groups->items.size(); ++g) {
      const Value* group = as_dict(groups->items[g]);
      auto params = group ? group->get("params") : nullptr;
      std::string where = join_path(path, "param_groups." + std::to_string(g) + ".params");
      if (!params || !(params->is(Kind::kList) || params->is(Kind::kTuple))) {
        // Without every group's parameters, state cannot be matched to them.
        // An incomplete read has already said why they are missing.
        if (complete_) problem(where, "'" + where + "' is missing or not a list of parameters");
        return;
      }
      for (const auto& p : params->items) {
        std::string name = p->is(Kind::kStr) ? p->text : p->is(Kind::kInt) ? std::to_string(p->int_value) : p->repr(1);
        auto [it, fresh] = group_of.emplace(name, static_cast<int>(g));
        if (!fresh)
          problem(where, "parameter '" + name + "' is listed " +
                             (it->second == static_cast<int>(g)
                                  ? "twice in param_groups " + std::to_string(g)
                                  : "in param_groups " + std::to_string(it->second) + " and " + std::to_string(g)) +
                             " of '" + path + "'");
        if (params_model && p->is(Kind::kStr) && !find_param(*params_model, name))
          problem(where, "'" + where + "' lists parameter '" + name + "', which the model does not hold");
      }
    }
    const Value* state = as_dict(optim.get("state"));
    for (const auto& [key, per_param] : state->entries) {
      std::string name = path_component(*key);
      std::string where = join_path(path, "state." + name);
      if (!group_of.count(name)) {
        problem(where, "optimizer state '" + where + "' is for parameter '" + name +
                           "', which no param_groups entry of '" + path + "' lists");
        continue;
      }
      if (!params_model || !key->is(Kind::kStr)) continue;
      if (const Value* entries = as_dict(per_param))
        for (const auto& [skey, svalue] : entries->entries)
          check_shape(join_path(where, path_component(*skey)), name, path_component(*skey), *svalue, *params_model);
    }
  }

  // The flattened form: every state entry's parameter has param_groups
  // entries, every parameter those name is a model tensor, and per-element
  // state has its parameter's shape.
  void check_flat(const Value& optim, const std::string& path, const Value* params_model) {
    std::set<std::string> grouped;
    for (const auto& [key, value] : optim.entries)
      if (auto parts = split_flat_key(key->text, "param_groups.")) grouped.insert(parts->first);
    for (const std::string& name : grouped)
      if (params_model && !find_param(*params_model, name)) {
        const std::string where = join_path(path, "param_groups." + name);
        problem(where, "'" + where + "' is for parameter '" + name + "', which the model does not hold");
      }
    std::set<std::string> reported;
    for (const auto& [key, value] : optim.entries) {
      auto parts = split_flat_key(key->text, "state.");
      if (!parts) continue;
      const auto& [name, sname] = *parts;
      std::string where = join_path(path, key->text);
      if (!grouped.count(name)) {
        if (reported.insert(name).second)
          problem(where, "optimizer state '" + where + "' is for parameter '" + name +
                             "', which no param_groups entry of '" + path + "' names");
        continue;
      }
      if (params_model) check_shape(where, name, sname, *value, *params_model);
    }
  }

 private:
  // A per-element state tensor has its parameter's shape (0-dim: step
  // counters; Adafactor's factored moments excepted).
  void check_shape(const std::string& where, const std::string& name, const std::string& state_name, const Value& state,
                   const Value& params_model) {
    auto idx = tensor_ref_index(state);
    auto param = find_param(params_model, name);
    if (!idx || !param || kFactoredState.count(state_name)) return;
    const TensorEntry& s = model_.tensors.at(*idx);
    const TensorEntry& p = model_.tensors.at(*param);
    if (s.shape.empty() || s.shape == p.shape) return;
    problem(where, "optimizer state '" + where + "' has shape " + shape_str(s.shape) + ", its parameter '" + name +
                       "' has shape " + shape_str(p.shape));
  }

  void problem(const std::string& key, std::string message) {
    sink_.report(Problem{ErrorCode::kDataLoss, std::move(message), "", -1, key});
  }

  const CheckpointModel& model_;
  bool complete_;
  ProblemSink& sink_;
};

}  // namespace

int check_optimizer_state(const CheckpointModel& model, bool complete, ProblemSink& sink) {
  if (!model.root) return 0;
  OptimizerChecker checker(model, complete, sink);
  const Value* root = as_dict(model.root);
  if (!root) return 0;
  if (is_optimizer_dict(*root)) {
    checker.check(*root, "", nullptr);
    return 1;
  }
  // {"model": ..., "optim": ...} as DCP and paired rank families hold them.
  const Value* params_model = as_dict(root->get("model"));
  int found = 0;
  for (const auto& [key, value] : root->entries) {
    const Value* d = as_dict(value);
    if (!d) continue;
    if (is_optimizer_dict(*d))
      checker.check(*d, path_component(*key), params_model);
    else if (is_flat_optimizer_dict(*d))
      checker.check_flat(*d, path_component(*key), params_model);
    else
      continue;
    ++found;
  }
  return found;
}

}  // namespace ckpt::check
