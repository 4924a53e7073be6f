#include "formats/torch_pt/quarantined_pt.h"

#include "core/log.h"
#include "formats/torch_pt/pt_reader.h"
#include "io/byte_source.h"
#include "model/tree_walk.h"
#include "pickle/framework_objects.h"
#include "pickle/policy.h"

namespace ckpt::torch_pt {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// A global of the decoded tree the checkpoint policy allows, or the tensor
// references the decoder put in place of tensor rebuilds.
bool known_global(std::string_view module, std::string_view name) {
  static const ValuePtr ref = make_tensor_ref(0);
  if (module == ref->callable->text && name == ref->callable->name) return true;
  return pickle::checkpoint_policy().allows(module, name);
}

void screen_unknown_globals(Value& root, const std::string& path, const std::string& only,
                            const std::function<bool(const std::string&)>& reader_uses,
                            std::string_view unknown_entries) {
  auto& entries = root.entries;
  for (auto it = entries.begin(); it != entries.end();) {
    std::string global = unknown_global_in(*it->second);
    if (global.empty()) global = unknown_global_in(*it->first);
    if (global.empty()) {
      ++it;
      continue;
    }
    std::string key = path_component(*it->first);
    std::string what =
        path + ": entry '" + key + "' names global '" + global + "', which is not one a checkpoint needs";
    const bool used = reader_uses(key);
    if (used || only.empty())
      fail(ErrorCode::kUnsafe, what + "; refusing to load it" +
                                   (used ? std::string()
                                         : " (it is " + std::string(unknown_entries) +
                                               ": with --only model or --only optim, which never need it, consolidate, "
                                               "reshard, validate and diff skip it)") +
                                   pickle::allow_global_hint(global));
    log::warn(what + ": skipped, --only " + only + " does not need it");
    it = entries.erase(it);
  }
}

}  // namespace

std::string unknown_global_in(const Value& v) { return pickle::first_quarantined_global(v, known_global); }

QuarantinedPt decode_quarantined(const std::string& path, int rank, ProblemSink* problems, const std::string& only,
                                 const std::function<bool(const std::string& key)>& reader_uses,
                                 std::string_view unknown_entries, std::string_view expected) {
  QuarantinedPt d;
  d.path = path;
  d.rank = rank;
  // Unknown globals are recorded, never called, and screened below before
  // anything reads the tree.
  pickle::QuarantinePolicy quarantine(pickle::checkpoint_policy());
  d.root = decode_archive(open_mapped_source(path), d.tensors, "", rank, problems, quarantine);
  if (!d.root || !d.root->is(Kind::kDict)) {
    std::string global = d.root ? unknown_global_in(*d.root) : "";
    if (!global.empty())
      fail(ErrorCode::kUnsafe, path + ": global '" + global +
                                   "' is not one a checkpoint needs; refusing to load a pickle that names it" +
                                   pickle::allow_global_hint(global));
    fail_data_loss(path + ": not " + std::string(expected));
  }
  screen_unknown_globals(*d.root, path, only, reader_uses, unknown_entries);
  return d;
}

}  // namespace ckpt::torch_pt
