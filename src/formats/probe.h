// Which registered input format a source is, by asking every format's probe
// (formats/registry.h) and taking the most confident answer: the directory
// and file probes that detect (formats/detect.h) and the folders of
// checkpoints (formats/checkpoint_root.h) both ask, so neither includes the
// other to ask it.
#pragma once

#include <optional>
#include <string>

#include "formats/input_format.h"
#include "io/byte_source.h"

namespace ckpt {

// The kind of checkpoint the directory `dir` is, or nullopt when it is none
// (it may still be a folder of checkpoints: formats/checkpoint_root.h).
std::optional<SourceKind> directory_kind(const std::string& dir);

// The kind of the file `path` (open as `file`, for its first bytes); nullopt
// when no file format recognises it.
std::optional<SourceKind> file_kind(const std::string& path, const ByteSource& file);

// "no DCP .metadata, no DeepSpeed `latest` or *_model_states.pt, ...": what
// each directory format would have shown, for "not a recognised checkpoint".
std::string directory_shapes();

// "pt, safetensors, ...": the kinds a single file may be, for "not a
// recognised checkpoint file".
std::string file_kinds();

}  // namespace ckpt
