// LocalStorage's opens (io/byte_source.cc): the POSIX file sources behind
// storage_for(path).open() for local paths. Only io/storage.cc calls them;
// everything else opens through the storage layer (io/storage.h).
#pragma once

#include <string>

#include "io/byte_source.h"

namespace ckpt {

// pread source from the bounded descriptor pool; containment applied.
SourcePtr open_local_file(const std::string& path);
// The whole file mapped read-only (pread for empty files); containment applied.
SourcePtr open_local_mapped(const std::string& path);

}  // namespace ckpt
