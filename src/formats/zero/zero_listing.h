// The files of a DeepSpeed checkpoint's tag directory, found by name
// (docs/deepspeed.md): the ZeRO rank files of each model-parallel rank
// (pipeline stage), the pipeline's layer files and MoE expert files. Only
// names are looked at here; zero_reader.cc decodes them.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::zero {

struct RankFile {
  int rank = -1;
  std::string path;
};

struct TagFiles {
  std::string dir;
  std::vector<RankFile> optim;  // by rank
  std::vector<RankFile> model;  // ZeRO-3: by rank; ZeRO-1/2: the one mp_rank_00 file
  bool per_rank_model = false;
};

// A tag directory's files: one TagFiles per model-parallel rank, the
// pipeline's layer files and the MoE expert files (docs/deepspeed.md).
struct TagListing {
  std::string dir;
  std::vector<TagFiles> mp_ranks;  // by mp rank: the pipeline stages, the tensor-parallel ranks, or mp_rank_00 alone
  std::map<int, std::string> layer_files;  // layer_LL-model_states.pt by layer index
  // a topology with a tensor axis: layer_LL-model_TT-model_states.pt, by TT then LL
  std::map<int, std::map<int, std::string>> tp_layer_files;
  std::map<std::pair<int, int>, std::string> expert_files;  // layer_L_expert_E_mp_rank_00 by (L, E)
};

// True for a folder holding a *_model_states.pt file.
bool has_model_states(const std::string& dir);

// True for a checkpoint root (a `latest` file naming a tag directory) or a
// tag directory holding DeepSpeed's *_model_states.pt files.
bool is_zero_checkpoint(const std::string& dir);

// True for a DeepSpeed root: a folder whose tag directories hold the
// *_model_states.pt files (inspect lists its tags), not a tag itself.
bool is_deepspeed_root(const std::string& dir);

// True for a directory holding DeepSpeed's *_optim_states.pt or
// *_model_states.pt files: a tag, finished or not.
bool holds_zero_files(const std::string& dir);

// A tag directory's world size from its file names: for each
// model-parallel rank (pipeline stage) 0..S-1, the optimizer files are ranks
// 0..N-1, each once, beside its model-states file (ZeRO-3: one per rank);
// S x N. nullopt when a rank's file or the model states are missing, as in
// a save that died. A save whose last ranks' files are all missing looks
// complete at a smaller N: validate --expect-world-size tells.
// A tag without ZeRO (stage0.h) is nullopt here: its names alone are those
// of a ZeRO save that died before its optimizer files (stage0_world_size
// reads which).
std::optional<int> tag_world_size(const std::string& dir);

// The tag directory SRC names: SRC itself, or SRC/<tag> (default: `latest`).
std::string tag_dir(const std::string& src, const std::string& tag);

// A tag directory's files, every rank file of every stage required (NotFound
// naming the first missing one); MoE files of a layout ckptconv does not
// read are refused (Unimplemented, naming them).
TagListing list_files(const std::string& dir);

}  // namespace ckpt::zero
