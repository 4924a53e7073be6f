// LocalStorage's opens (io/byte_source.cc): the POSIX file sources behind
// storage_for(path).open() for local paths. Only io/storage.cc calls them;
// everything else opens through the storage layer (io/storage.h).
#pragma once

#include <memory>
#include <string>

namespace ckpt {

// As io/byte_source.h declares them: this header is included by the file
// defining them (byte_source.cc), so it names them without including it.
class ByteSource;
using SourcePtr = std::shared_ptr<const ByteSource>;

// pread source from the bounded descriptor pool; containment applied.
SourcePtr open_local_file(const std::string& path);
// The whole file mapped read-only (pread for empty files); containment applied.
SourcePtr open_local_mapped(const std::string& path);

}  // namespace ckpt
