// A policy that allows every global: for tests about the unpickling machine
// itself, not about the allow-list (checkpoint_policy has its own tests).
#pragma once

#include "pickle/policy.h"

namespace ckpt::pickle::testing {

class AllowAllPolicy : public GlobalPolicy {
 public:
  bool allows(std::string_view, std::string_view) const override { return true; }
  void check_call(const Value&, const Value&, const Value*, CallOp) const override {}
  void check_build(const Value&, const Value&) const override {}
  void check_fill(const Value&) const override {}
};
inline const AllowAllPolicy kAllowAll;

}  // namespace ckpt::pickle::testing
