// Training output folders that hold many checkpoints ("checkpoint roots"):
// torchtitan's `checkpoint/step-<N>/`, Accelerate's
// `checkpoints/checkpoint_<N>/`, Lightning's `epoch=E-step=S.ckpt/`, or any
// folder of DCP directories; and DeepSpeed roots (`latest`,
// `latest_universal` and tag folders, ZeRO and universal side by side),
// whose tag is chosen here too, by the rule of docs/deepspeed.md ("SRC").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {

struct RootEntry {
  std::string name;               // the subdirectory's name
  std::string path;               // root/name
  std::string kind;               // "dcp", "dcp-pair", "fsdp-ranks", "deepspeed-zero", "deepspeed-universal"
  bool complete = false;          // its metadata is present (a save that finished)
  std::optional<int64_t> step;    // the last number in its name
  int world_size = -1;            // from its .distcp / rank file names, -1 when unknown
  bool latest = false;            // the one the folder's `latest` file names
  bool latest_universal = false;  // the one its `latest_universal` file names
};

// The checkpoints directly inside `dir`, ordered by step then name; empty
// when `dir` is no folder or holds none.
std::vector<RootEntry> list_checkpoints(const std::string& dir);

// The checkpoint to read for SRC and --tag, and how it was chosen:
// - SRC is itself a checkpoint, or a file: SRC (a --tag is then a usage
//   error: it would name nothing that is read);
// - SRC holds checkpoints: the one --tag NAME names, whatever its kind;
//   `--tag latest` is the one the file `latest` names when present, else
//   the highest-numbered complete one; with no --tag, the only one, else
//   as --tag latest (a run's folder of steps is read at its latest, as a
//   resuming job reads it; `why` says which and that --tag reads another),
//   or InvalidArgument (exit 2) listing them when none is complete and
//   numbered;
// - a DeepSpeed root (its `latest` names a DeepSpeed tag, or its
//   `latest_universal` a universal one): the same, except that with no --tag
//   it is what `latest` names (what DeepSpeed's engine.load_checkpoint(ROOT)
//   reads), else, with no `latest`, what `latest_universal` names, and that
//   `--tag latest_universal` is what that file names. A DeepSpeed tag whose
//   rank files are missing is still chosen: its reader names the file;
// - a --tag naming none of them: NotFound listing them.
struct ChosenCheckpoint {
  std::string path;  // SRC, or the checkpoint inside it
  std::string why;   // how it was chosen ("--tag global_step10", "the tag `latest` names"); empty for SRC
};
ChosenCheckpoint choose_checkpoint(const std::string& src, const std::string& tag);
// choose_checkpoint(src, tag).path.
std::string resolve_checkpoint(const std::string& src, const std::string& tag);

// Why `dir` is a checkpoint whose save never finished (DCP .distcp files
// or Accelerate's parts without their .metadata; a DeepSpeed tag missing a
// rank's files), as a folder listing calls it INCOMPLETE; nullopt otherwise.
struct UnfinishedSave {
  std::string format;  // as RootEntry::kind: "dcp", "dcp-pair", "deepspeed-zero"
  std::string why;     // a sentence naming `dir`
};
std::optional<UnfinishedSave> unfinished_save(const std::string& dir);

// True when SRC is a folder of checkpoints rather than one (inspect lists it).
bool is_checkpoint_root(const std::string& src);

// The size of all files under `dir` (listing only: resolving never needs it).
uint64_t directory_bytes(const std::string& dir);

// One line per entry: name, step, kind, world size, size, complete or not.
std::string describe_root(const std::string& dir, const std::vector<RootEntry>& entries);

}  // namespace ckpt
