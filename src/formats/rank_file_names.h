// Names of per-rank checkpoint files (docs/formats.md §3) and how a family of them
// is found: in a directory, through a glob, or listed one by one.
//
//   veRL        model_world_size_{N}_rank_{r}.pt, optim_world_size_{N}_rank_{r}.pt
//               (extra_state_world_size_{N}_rank_{r}.pt holds RNG state: skipped)
//   Accelerate  pytorch_model_fsdp_rank{r}.bin
//   generic     *rank{r}*.pt / .pth / .bin   (also rank_{r}, rank-{r})
//   numbered    files whose names differ in exactly one integer, which
//               runs over ranks from 0: model_shard_{r}.pt,
//               optimizer_shard_{r}.pt, {r}.pt, ckpt-{r:02d}.pt (checked
//               against the ranks their sharded values carry when read)
//
// A family is the files whose names differ only in the rank (the template,
// e.g. "optim_rank{r}.pt"). Its kind is "optim" when the template says
// "optim", else "model" when it says "model", else "".
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ckpt::fsdp_ranks {

struct RankFileName {
  int rank = -1;
  int world_size = -1;     // from the name (veRL), -1 when the name does not say
  std::string tmpl;        // the name with the rank (and world size) replaced: "model_world_size_{N}_rank_{r}.pt"
  std::string kind;        // "model", "optim" or ""
  bool auxiliary = false;  // a per-rank file that is no state dict (veRL extra_state)
  int digits = 0;          // the rank's zero-padded width in the name (ckpt-01.pt: 2), 0 when not padded

  // The file name this family would give `rank` (for naming a missing file).
  std::string name_for(int rank) const;
};

// Parses a file name (no directory part); nullopt when it names no rank.
std::optional<RankFileName> parse_rank_file_name(const std::string& filename);

// The template of a numbered family ("model_shard_{r}.pt") as a name
// without a rank: what reshard names new files by.
RankFileName name_from_template(const std::string& tmpl);

// Each file's rank name: by parse_rank_file_name, else as a member of a
// numbered family among `paths` (two or more names that differ only in one
// integer, which includes 0 and stays below twice their count: ranks, not
// steps). Files that are neither are left out, in `unnamed` when given.
std::vector<std::pair<std::string, RankFileName>> name_rank_files(const std::vector<std::string>& paths,
                                                                  std::vector<std::string>* unnamed = nullptr);

// True when SRC is a glob pattern (has *, ? or [) rather than a path.
bool is_glob_pattern(const std::string& src);

// The per-rank state-dict files directly inside `dir`, sorted; auxiliary
// files and files without a rank in their name are left out.
std::vector<std::string> list_rank_files(const std::string& dir);

// The files a glob matches, sorted; NotFound naming the pattern when none.
std::vector<std::string> expand_glob(const std::string& pattern);

}  // namespace ckpt::fsdp_ranks
