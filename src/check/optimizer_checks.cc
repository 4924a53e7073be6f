#include "check/optimizer_checks.h"

#include <map>
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
      auto param = find_param(*params_model, name);
      const Value* entries = as_dict(per_param);
      if (!param || !entries) continue;
      const TensorEntry& p = model_.tensors.at(*param);
      for (const auto& [skey, svalue] : entries->entries) {
        auto idx = tensor_ref_index(*svalue);
        std::string sname = path_component(*skey);
        if (!idx || kFactoredState.count(sname)) continue;
        const TensorEntry& s = model_.tensors.at(*idx);
        if (s.shape.empty() || s.shape == p.shape) continue;  // 0-dim: step counters
        problem(join_path(where, sname), "optimizer state '" + join_path(where, sname) + "' has shape " +
                                             shape_str(s.shape) + ", its parameter '" + name + "' has shape " +
                                             shape_str(p.shape));
      }
    }
  }

 private:
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
    if (!d || !is_optimizer_dict(*d)) continue;
    checker.check(*d, path_component(*key), params_model);
    ++found;
  }
  return found;
}

}  // namespace ckpt::check
