// Which globals an unpickled stream may name. The unpickler never imports or
// calls anything; the policy exists so that a stream naming os.system,
// builtins.eval or subprocess.Popen is refused (Unsafe, exit 3) instead of
// being decoded as if it were a checkpoint.
#pragma once

#include <string_view>

namespace ckpt::pickle {

class GlobalPolicy {
 public:
  virtual ~GlobalPolicy() = default;
  virtual bool allows(std::string_view module, std::string_view name) const = 0;
};

// Everything a torch.save checkpoint, a DCP .metadata or a per-rank FSDP file
// legitimately names (FORMATS.md): tensor rebuild functions, storage classes,
// dtypes, torch.Size/device, OrderedDict, ShardedTensor/DTensor and their
// metadata, DCP metadata classes, pathlib paths, getattr for enums.
const GlobalPolicy& checkpoint_policy();

}  // namespace ckpt::pickle
