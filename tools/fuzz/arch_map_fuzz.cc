// libFuzzer target for architecture maps (plan/arch_map.h, docs/maps.md):
// the input is a map's JSON text, parsed as a user's --map FILE is, then,
// when it parses, applied to a small model (a one-layer Megatron GPT that
// the built-in Llama map exports: a padded embedding, a fused QKV and fc1
// in TP chunks cut where the sections are not) with a fixed config. Parsing must succeed or refuse with a ckpt::Error;
// applying must give a model whose chunks cover every tensor (apply_arch_map
// checks it) or refuse with a ckpt::Error. Crashes, sanitizer reports and
// other exceptions are bugs.
// Seeds: maps/*.json (scripts/fuzz).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/arch_map.h"

namespace {

ckpt::TensorEntry tensor(const std::string& name, ckpt::Shape shape, std::vector<int64_t> cuts) {
  ckpt::TensorEntry t;
  t.name = name;
  t.shape = shape;
  std::vector<int64_t> starts = {0};
  if (!shape.empty()) starts.insert(starts.end(), cuts.begin(), cuts.end());
  for (std::size_t i = 0; i < starts.size(); ++i) {
    ckpt::TensorChunk c;
    c.offsets.assign(shape.size(), 0);
    c.sizes = shape;
    if (!shape.empty()) {
      c.offsets[0] = starts[i];
      c.sizes[0] = (i + 1 < starts.size() ? starts[i + 1] : shape[0]) - starts[i];
    }
    c.strides = ckpt::contiguous_strides(c.sizes);
    c.storage = ckpt::make_memory_source(std::string(ckpt::shape_numel(c.sizes) * 4, '\0'));
    t.chunks.push_back(c);
  }
  return t;
}

ckpt::CheckpointModel model() {
  std::vector<ckpt::TensorEntry> ts = {
      tensor("embedding.word_embeddings.weight", {16, 4}, {8}),
      tensor("decoder.layers.0.self_attention.linear_qkv.weight", {16, 4}, {8}),
      tensor("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", {4}, {}),
      tensor("decoder.layers.0.self_attention.linear_proj.weight", {4, 8}, {2}),
      tensor("decoder.layers.0.mlp.linear_fc1.layer_norm_weight", {4}, {}),
      tensor("decoder.layers.0.mlp.linear_fc1.weight", {12, 4}, {3, 9}),
      tensor("decoder.layers.0.mlp.linear_fc2.weight", {4, 6}, {2}),
      tensor("decoder.final_layernorm.weight", {4}, {}),
      tensor("output_layer.weight", {16, 4}, {5}),
  };
  ckpt::CheckpointModel m;
  std::vector<std::pair<ckpt::pickle::ValuePtr, ckpt::pickle::ValuePtr>> entries;
  for (std::size_t i = 0; i < ts.size(); ++i)
    entries.emplace_back(ckpt::pickle::Value::str(ts[i].name), ckpt::make_tensor_ref(i));
  m.tensors = std::move(ts);
  m.root = ckpt::pickle::Value::dict(std::move(entries));
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static const ckpt::CheckpointModel source = model();
  static const ckpt::ConfigFields config = {
      {"vocab_size", 12}, {"hidden_size", 4},       {"num_attention_heads", 2}, {"num_key_value_heads", 1},
      {"head_dim", 4},    {"intermediate_size", 6}, {"num_hidden_layers", 1},   {"tie_word_embeddings", 0}};
  try {
    ckpt::ArchMap map = ckpt::parse_arch_map(std::string(reinterpret_cast<const char*>(data), size), "fuzz", "fuzz");
    ckpt::apply_arch_map(source, map, config, "config.json");
  } catch (const ckpt::Error&) {
  }
  return 0;
}
