#include "formats/safetensors/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "formats/safetensors/safetensors_format.h"
#include "model/ordered_json.h"
#include "model/tree_walk.h"
#include "model/value_json.h"

namespace ckpt::safetensors {
namespace {

using Json = nlohmann::ordered_json;

struct Named {
  std::size_t index;
  std::string name;
};

// Each tensor once, under the first path that reaches it, in tree order.
std::vector<Named> name_tensors(const CheckpointModel& model) {
  std::vector<Named> out;
  std::vector<bool> seen(model.tensors.size(), false);
  require_distinct_paths(*model.root, "safetensors");
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    if (!leaf.tensor || seen[*leaf.tensor]) return;
    seen[*leaf.tensor] = true;
    out.push_back({*leaf.tensor, leaf.path});
  });
  return out;
}

// value_to_json writes tensors as {"__tensor__": index}; safetensors names them.
void name_tensor_refs(Json& j, const std::vector<std::string>& names) {
  if (j.is_object()) {
    auto it = j.find("__tensor__");
    if (j.size() == 1 && it != j.end() && it->is_number_unsigned()) {
      j = Json{{"__tensor__", names.at(it->get<std::size_t>())}};
      return;
    }
    for (auto& v : j) name_tensor_refs(v, names);
  } else if (j.is_array()) {
    for (auto& v : j) name_tensor_refs(v, names);
  }
}

// A safetensors header is JSON, which holds only valid UTF-8; a pickled
// name may not be (Python pickles a lone surrogate with "surrogatepass",
// and safetensors' own save_file refuses it). Refused naming the tensor,
// never an internal error from the JSON writer.
void require_json_text(const std::string& text, const std::string& what) {
  try {
    (void)Json(text).dump();
  } catch (const Json::type_error&) {
    fail(ErrorCode::kUnimplemented, what + " is not valid UTF-8 (a lone surrogate Python's pickle keeps): a " +
                                        "safetensors header is JSON and cannot hold it; write .pt instead");
  }
}

std::string dump_header_json(const Json& j, const std::string& what) {
  try {
    return j.dump();
  } catch (const Json::type_error&) {
    fail(ErrorCode::kUnimplemented,
         what + " holds a string that is not valid UTF-8 (a lone surrogate Python's " +
             "pickle keeps): a safetensors header is JSON and cannot hold it; write .pt instead");
  }
}

std::map<std::string, std::string> values_metadata(const CheckpointModel& model, const std::vector<Named>& named) {
  std::vector<std::string> names(model.tensors.size());
  for (const auto& n : named) require_json_text(n.name, "tensor '" + n.name + "': its name");
  for (const auto& n : named) names[n.index] = n.name;
  OrderedObjectBuilder values;
  walk_leaves(*model.root, [&](const Leaf& leaf) {
    if (!leaf.tensor) values.set(leaf.path, value_to_json(*leaf.value));
  });
  Json tree = value_to_json(*model.root);
  name_tensor_refs(tree, names);
  return {{"format", "pt"},
          {"ckptconv.version", CKPT_VERSION},
          {"ckptconv.values", dump_header_json(values.get(), "a value of the state dict")},
          {"ckptconv.tree", dump_header_json(tree, "the state dict's tree")}};
}

FilePlan layout_file(const CheckpointModel& model, const std::vector<Named>& named,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<FileMember> members;
  members.reserve(named.size());
  for (const auto& n : named)
    members.push_back({n.index, n.name, model.tensors[n.index].output_dtype(), model.tensors[n.index].shape});
  return plan_file(std::move(members), metadata);
}

std::string shard_name(std::size_t i, std::size_t n, const std::string& stem) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return stem + buf;
}

}  // namespace

FilePlan plan_file(std::vector<FileMember> members, const std::map<std::string, std::string>& metadata) {
  std::stable_sort(members.begin(), members.end(), [](const FileMember& a, const FileMember& b) {
    int ra = dtype_sort_rank(a.dtype), rb = dtype_sort_rank(b.dtype);
    return ra != rb ? ra > rb : a.name < b.name;
  });
  FilePlan file;
  OrderedObjectBuilder header;
  if (!metadata.empty()) {
    Json md = Json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header.set("__metadata__", md);
  }
  uint64_t offset = 0;
  for (const auto& m : members) {
    auto code = dtype_code(m.dtype);
    if (!code)
      fail_invalid("tensor '" + m.name + "': safetensors has no dtype for " + std::string(dtype_name(m.dtype)) +
                   " (use .pt or .h5, or --dtype)");
    require_json_text(m.name, "tensor '" + m.name + "': its name");
    // The header's one reserved key: a tensor under it replaced the metadata,
    // and every reader (safetensors' load_file, ckptconv) refused the file
    // written with exit 0.
    if (m.name == "__metadata__")
      fail(ErrorCode::kUnimplemented,
           "tensor '__metadata__': safetensors reserves this name for the header's "
           "metadata, so no reader could load it; write .pt or .h5 instead");
    uint64_t n = shape_numel(m.shape) * dtype_size(m.dtype);
    header.set(m.name, Json{{"dtype", std::string(*code)},
                            {"shape", header_shape(m.name, m.dtype, m.shape)},
                            {"data_offsets", {offset, offset + n}}});
    file.tensors.push_back({m.index, m.name, offset, offset + n});
    offset += n;
  }
  file.data_size = offset;
  file.header = header.get().dump();
  file.header.append((8 - file.header.size() % 8) % 8, ' ');
  return file;
}

Plan plan_safetensors(const CheckpointModel& model, const std::string& output_name, uint64_t max_shard_size) {
  std::vector<Named> named = name_tensors(model);  // plan_file refuses a dtype safetensors lacks
  auto metadata = values_metadata(model, named);
  Plan plan;
  if (max_shard_size == 0) {
    plan.files.push_back(layout_file(model, named, metadata));
    plan.files.back().file_name = output_name;
    return plan;
  }
  std::vector<std::vector<Named>> shards;
  uint64_t current = 0;
  for (const auto& n : named) {
    uint64_t size = model.tensors[n.index].output_nbytes();
    if (shards.empty() || (current > 0 && current + size > max_shard_size)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(n);
    current += size;
  }
  if (shards.size() <= 1) {
    plan.files.push_back(layout_file(model, named, metadata));
    plan.files.back().file_name = output_name;
    return plan;
  }
  // "model.safetensors" -> stem "model", index "model.safetensors.index.json".
  std::string stem = output_name;
  if (stem.size() > 12 && stem.ends_with(".safetensors")) stem.resize(stem.size() - 12);
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    plan.files.push_back(layout_file(model, shards[i], metadata));
    plan.files.back().file_name = shard_name(i, shards.size(), stem);
    for (const auto& t : plan.files.back().tensors) weight_map[t.name] = plan.files.back().file_name;
    total += plan.files.back().data_size;
  }
  Json index{{"metadata", {{"total_size", total}}}, {"weight_map", Json::object()}};
  Json& map = index["weight_map"];
  for (const auto& [k, v] : weight_map) append_member(map, k, v);  // std::map keys: distinct and sorted
  plan.index_json = index.dump(2) + "\n";
  return plan;
}

void write_safetensors_file(ByteSink& sink, const FilePlan& file, const FillTensor& fill) {
  uint64_t start = sink.position();
  unsigned char prefix[8];
  uint64_t n = file.header.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(n >> (8 * i));
  sink.write(prefix, 8);
  sink.write(file.header);
  uint64_t data_start = start + 8 + n;
  for (const auto& t : file.tensors) {
    fill(t.index, sink);
    if (sink.position() - data_start != t.end)
      fail(ErrorCode::kInternal, "tensor '" + t.name + "': wrote " +
                                     std::to_string(sink.position() - data_start - t.begin) + " bytes, expected " +
                                     std::to_string(t.end - t.begin));
  }
}

}  // namespace ckpt::safetensors
