// The file `latest` beside a training job's checkpoints (DeepSpeed writes
// one; torchtitan-style folders may have one): the name of the tag or step
// directory to read, as text. It is input like any other, so it is bounded
// and checked before it names a directory or appears in a message.
#pragma once

#include <optional>
#include <string>

namespace ckpt {

// The tag `file` names, read as DeepSpeed reads it: the whole text without
// the whitespace around it; nullopt when there is no such file. DataLoss
// naming the file (and at most the first 64 bytes of what it holds) when it
// is longer than a directory name can be (NAME_MAX, 255 bytes), spans lines,
// starts with a byte-order mark, or is empty, ".", "..", or holds '/' or
// NUL: not a directory directly inside the folder.
// Read through the storage layer (io/storage.h), as every file is.
std::optional<std::string> read_latest_tag(const std::string& file);

}  // namespace ckpt
