// Architecture maps (docs/maps.md): a training framework's tensor names and
// layouts rewritten as another architecture's (a Megatron-core GPT as
// Hugging Face's LlamaForCausalLM), declared as data in a JSON file.
//
// A map is a pure model-to-model transform: every operation it offers
// (rename, split of a fused tensor per group into sections, unpad of a
// vocabulary, permute_rope) picks rows of a source tensor along dim 0, or
// adds or takes a leading dim (stack, unstack: experts), or writes a tensor
// twice (tie), so it rewrites names, shapes and chunks and reads no byte. The executor then
// gathers the strided chunks within --memory-limit as it gathers any other
// source's, and the writers stay as they are.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt {

// Rows start, start+step, ..., start+(count-1)*step of a tensor's dim 0.
struct RowRun {
  int64_t start = 0;
  int64_t count = 0;
  int64_t step = 1;
};

// A tensor named `name` made of `source`'s dim-0 rows `runs`, in order
// (the other dims kept): each source chunk intersected with each run gives
// a chunk with its storage offset moved to the run's first row in it and
// its dim-0 stride multiplied by the run's step. No byte is read.
// InvalidArgument (a bug in the map) when a run leaves the tensor.
TensorEntry gather_rows(const TensorEntry& source, const std::vector<RowRun>& runs, const std::string& name);

// The runs of dim 0 that `split` gives for section `index`: a tensor of
// `groups` blocks, each block the sections' rows one after another (a
// Megatron linear_qkv: per query group, its query heads' rows, then the
// key's, then the value's; groups = 1 for [gate; up]).
std::vector<RowRun> split_runs(int64_t groups, const std::vector<int64_t>& sections, std::size_t index);

// The runs of permute_rope from interleaved rotary pairs (rows 0,1 a pair)
// to half-split ones (rows i, i+head_dim/2 a pair), for `rows` rows of
// heads of `head_dim` rows: per head its even rows, then its odd ones.
std::vector<RowRun> interleaved_to_half_runs(int64_t rows, int64_t head_dim);

// stack: `slice` placed at index `index` of `stacked`'s leading dim (the
// dim stack adds: experts stacked into transformers' fused 3-D tensors):
// each of its chunks gains that dim, of size 1 at offset `index`. No byte
// is read. InvalidArgument (a bug in the map) when the slice's shape is not
// the stacked one's after its leading dim, or the index leaves it.
void place_slice(TensorEntry& stacked, const TensorEntry& slice, int64_t index);

// unstack: slice `index` of `source`'s leading dim, that dim dropped, named
// `name`: the chunks holding it, each narrowed to it. No byte is read.
TensorEntry slice_of(const TensorEntry& source, int64_t index, const std::string& name);

// One rule of a map: a source name pattern ({X} matches a decimal index,
// captured and put into the targets), or several naming one tensor in
// different specs (a source holds one of them), and what it becomes.
struct MapRule {
  enum class Op { kRename, kSplit, kUnpad, kPermuteRope, kStack, kUnstack };
  std::vector<std::string> from;
  std::vector<std::string> to;  // one target; one per section for split
  Op op = Op::kRename;
  std::string groups;                 // split: an expression
  std::vector<std::string> sections;  // split: an expression per target
  std::string rows;                   // unpad: the rows kept
  std::string head_dim;               // permute_rope
  // stack: the index along the target's new leading dim where each source
  // goes, an expression of config fields and the placeholders the source
  // captured ("E"); the target's shape gives the dim's size.
  std::string stack;
  // unstack: the placeholder the targets put each index of the source's
  // leading dim into ("E"), counted by "indices" like a captured one.
  std::string unstack;
  // tie: the rule writes a second copy of a tensor another rule writes (the
  // output layer of a model that shares it with the embedding, for a
  // target that does not tie by itself): it matches besides the first
  // matching rule, whatever their order, and claims nothing.
  bool tie = false;
  std::vector<std::vector<std::string>> shapes;  // per target: an expression per dim, checked against the config
  bool optional = false;                         // the source may lack it
  // The rule is off when this config expression is non-zero (the output
  // layer when tie_word_embeddings): a source tensor it would match is then
  // refused as having no place in the model.
  std::string unless;
};

struct ArchMap {
  std::string name;    // a built-in's name, or the file's stem
  std::string origin;  // "built in" or the file's path, for messages
  std::string description;
  std::vector<std::string> source_kinds;   // format names (SourceInfo): the sources it applies to
  std::vector<std::string> architectures;  // a config's `architectures` it writes
  // More architectures whose folders the map reads backwards when reshard
  // is given no --map (a per-expert map: transformers 5 saves a mixture of
  // experts under those names), never chosen for an export.
  std::vector<std::string> back_architectures;
  // Index placeholders and the config expression counting them ({"L":
  // "num_hidden_layers"}): every index must be present once.
  std::map<std::string, std::string> indices;
  // Config fields a config may leave out, as expressions of others
  // (head_dim = hidden_size / num_attention_heads).
  std::map<std::string, std::string> defaults;
  std::vector<MapRule> rules;
  std::vector<std::string> skip;  // patterns of source entries left out (megatron's _extra_state)
  // Patterns of source tensors left out as `skip` ones are, but that the
  // target architecture has no place for only while they are zero
  // (torchtitan's MoE expert_bias_E): pattern -> what the tensor does, for
  // the warning an export gives when one is not (jobs/model_map.cc).
  std::map<std::string, std::string> skip_unless_zero;
  // The way back (plan/arch_map_inverse.h): source entries a Hugging Face
  // folder has no tensor for, written as None (megatron-core's
  // `_extra_state` of each linear layer, which its local spec saves as None
  // and a strict load asks for).
  std::vector<std::string> back_none;
};

// Parses a map; InvalidArgument naming `origin` and what is wrong. A map
// that "extends" a built-in one has its rules, skips, indices and defaults
// and adds its own.
ArchMap parse_arch_map(const std::string& text, const std::string& name, const std::string& origin);

// The maps built into the binary (maps/*.json at build time), by name.
const std::vector<ArchMap>& builtin_arch_maps();
const ArchMap* find_builtin_arch_map(const std::string& name);
// The built-in map for a source kind (format name) and a config's
// architecture; null when none.
const ArchMap* builtin_arch_map_for(const std::string& source_format, const std::string& architecture);

// A config's integer fields (config.json's top-level integers and booleans).
using ConfigFields = std::map<std::string, int64_t>;

// The model `map` makes of `model` (its tensors, as a flat dict of the new
// names; plain values are dropped: a model folder holds tensors): every
// source tensor matched by a rule or skipped, else Unimplemented naming it;
// every index present, else NotFound naming the missing tensor; every
// target's shape the config's, else DataLoss naming the tensor and the
// config fields (`config_name` in messages).
// With `unless_zero`, the source tensors a skip_unless_zero pattern left
// out: their index in model.tensors and the pattern's explanation.
struct DroppedTensor {
  std::size_t tensor;
  std::string why;
};
CheckpointModel apply_arch_map(const CheckpointModel& model, const ArchMap& map, const ConfigFields& config,
                               const std::string& config_name, std::vector<DroppedTensor>* unless_zero = nullptr);

// For the way back (plan/arch_map_inverse.h), which applies a map's rules
// in the other direction with the same expressions and patterns:
// `text` evaluated against the config (the errors of apply_arch_map), and a
// pattern with its placeholders ({L}) put in.
int64_t evaluate_map_expression(const std::string& text, const ArchMap& map, const ConfigFields& config,
                                const std::string& config_name);
std::string substitute_indices(const std::string& pattern, const std::map<std::string, std::string>& values);
// The placeholders of a pattern, in order ("decoder.layers.{L}.x" -> {"L"}).
std::vector<std::string> pattern_indices(const std::string& pattern);
// The index each placeholder of `pattern` takes in `name` ("l.{L}.w",
// "l.3.w" -> {L: "3"}); nullopt when the name does not match.
std::optional<std::map<std::string, std::string>> match_pattern(const std::string& pattern, const std::string& name);

}  // namespace ckpt
