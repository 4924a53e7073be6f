// An input format's descriptor: how detect recognises a source of the
// format, how it is read, and the traits the layers above ask of it. Each
// format folder defines its descriptor next to its reader
// (formats/<name>/<name>_format.cc); formats/registry.cc lists them all, the
// one registration point. Adding a format is a folder and a line there.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/problems.h"
#include "formats/source_traits.h"
#include "io/byte_source.h"
#include "model/checkpoint_model.h"

namespace ckpt {

struct ReadOptions {
  std::vector<std::string> files;  // --files: per-rank files given one by one (SRC is then empty)
  // --only model|optim. Per-rank families hold model and optimizer in
  // separate files, so their reader reads only that family and gives its
  // state dict alone (SourceTraits::reader_selects_only). The ZeRO and
  // DeepSpeed universal readers drop, with a warning, entries with globals
  // the policy does not know that the selection does not need (refused
  // without --only); Megatron's regroups its items into the model's own
  // names (layers unstacked) under "model" (and "optim"). The other readers
  // ignore it. Except for per-rank families, plan/select then applies it to
  // the tree's top-level keys.
  std::string only;
  // validate: readers verify the CRC-32 of every zip record and report each
  // problem they can read past here instead of failing on the first (see
  // core/problems.h); nullptr reads fail-fast, as consolidate needs.
  ProblemSink* problems = nullptr;
  // --tag: the checkpoint to read in a folder of them, a DeepSpeed root's
  // tag included (formats/checkpoint_root.h). read_checkpoint chooses it
  // before a reader runs, and readers get it empty.
  std::string tag = {};
  // inspect: one rank's file of a per-rank family or DeepSpeed tag may be
  // read alone, as the file it is (with a warning); other commands refuse
  // it (exit 2), as its content alone would make a wrong whole.
  bool one_rank_alone = false;
  // --param-layout: a checkpoint of the same model whose state dict gives
  // the parameter names, shapes and order that FSDP1 flat-parameter files
  // lack (formats/fsdp_flat/flat_params.h); other sources refuse it.
  std::string param_layout = {};
  // That checkpoint's model, read when called. read_checkpoint
  // (formats/detect.h), which reads sources, sets it; a reader calls it only
  // once it needs the layout (so a source refused first never reads it) and
  // never reads another checkpoint itself.
  std::function<CheckpointModel()> param_layout_model = {};
};

// How sure a probe is that a source is of its format. The highest answer
// among the registered formats wins, so a format that refines another (a
// Megatron torch_dist directory is also a DCP directory) answers above the
// one it refines. 0: not this format.
namespace confidence {
inline constexpr int kNo = 0;
inline constexpr int kNested = 10;   // recognised by a checkpoint inside it (Accelerate's pytorch_model_fsdp_0/)
inline constexpr int kLoose = 15;    // by loose files of its kind, nothing listing them (*.safetensors alone)
inline constexpr int kNames = 20;    // by the names of its files alone (rank{r} in per-rank file names)
inline constexpr int kIndex = 25;    // by an index that names its files (*.safetensors.index.json)
inline constexpr int kMarker = 30;   // by a file or bytes only this format writes (.metadata, `latest`, magic)
inline constexpr int kRefines = 40;  // a marker of a format that is a specialisation of another
}  // namespace confidence

struct InputFormat {
  SourceKind kind;
  // A directory of this format; nullptr: the format is never a directory.
  int (*probe_directory)(const std::string& dir) = nullptr;
  // A file of this format, given its first bytes; nullptr: never a file.
  int (*probe_file)(const std::string& path, const ByteSource& file) = nullptr;
  CheckpointModel (*read)(const std::string& src, const ReadOptions& options) = nullptr;
  SourceTraits traits = {};
  // What a directory of the format holds, for "not a recognised checkpoint"
  // ("DCP .metadata"); empty for file formats.
  std::string_view directory_shape = {};
  // For help texts (jobs/source_kinds.h), after the kind's name
  // (source_kind_name): how a source of the format is given and recognised.
  std::string_view description = {};
};

}  // namespace ckpt
