// Reader of torch.save archives (docs/formats.md §1): data.pkl unpickled under the
// checkpoint policy, every `_rebuild_tensor_v2/_v3` (and `_rebuild_parameter`)
// turned into a TensorEntry whose single chunk points at its storage record.
// Tensor bytes are never read here.
#pragma once

#include <string>
#include <vector>

#include "core/problems.h"
#include "io/byte_source.h"
#include "model/checkpoint_model.h"
#include "pickle/policy.h"

namespace ckpt::torch_pt {

// Decodes the archive in `source` (a whole file, or a DCP item slice).
// Tensors found are appended to `tensors`, named `name_prefix` + their path
// in the object; the returned tree holds tensor references in their place.
// `rank` is recorded in each chunk for messages (-1 when unknown).
// `verify` (validate): the CRC-32 of every record is checked, each mismatch
// reported there naming the file, record, rank and the tensors it holds.
// `policy`: what data.pkl may name and do (a QuarantinePolicy for files
// whose unknown entries the caller drops).
pickle::ValuePtr decode_archive(const SourcePtr& source, std::vector<TensorEntry>& tensors,
                                const std::string& name_prefix = "", int rank = -1, ProblemSink* verify = nullptr,
                                const pickle::GlobalPolicy& policy = pickle::checkpoint_policy());

// A whole .pt file as a model (its SourceInfo: a torch.save file). Detects the legacy (pre-1.6)
// format and refuses it clearly (Unimplemented).
CheckpointModel read_pt_file(const std::string& path, ProblemSink* verify = nullptr);

// True when the file starts like a torch.save zip; detection by magic bytes.
bool is_torch_zip(const ByteSource& source);
// True for the pre-1.6 formats (tar archive, or a raw pickle stream with
// torch's magic number).
bool is_legacy_torch_save(const ByteSource& source);

}  // namespace ckpt::torch_pt
