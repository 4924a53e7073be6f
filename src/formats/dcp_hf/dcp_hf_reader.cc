#include "formats/dcp_hf/dcp_hf_reader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/checked.h"
#include "core/error.h"
#include "core/linear_regex.h"
#include "formats/safetensors/safetensors_format.h"
#include "io/storage.h"
#include "model/ordered_json.h"

namespace ckpt::dcp_hf {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr const char* kShardingInfo = "DCP_SHARDING_INFO";

// "shard-00003-model-00001-of-00001.safetensors" -> rank 2; -1 for other names.
int rank_of(const std::string& path) {
  static const LinearRegex kName = LinearRegex::compile(R"(^shard-(\d{1,9})-.*\.safetensors$)");
  RegexMatch m;
  std::string name = fs::path(path).filename().string();
  if (!kName.match(name, m)) return -1;
  int n = std::stoi(m.str(1));
  return n >= 1 ? n - 1 : -1;
}

struct Piece {
  TensorChunk chunk;
  DType dtype;
};

}  // namespace

std::vector<std::string> list_safetensors(const std::string& dir) {
  std::vector<std::string> out;
  for (const DirEntry& entry : list_directory(dir))
    if (entry.is_file() && fs::path(entry.name).extension() == ".safetensors") out.push_back(entry.path);
  return out;
}

bool is_dcp_hf_dir(const std::string& dir) {
  std::vector<std::string> files = list_safetensors(dir);
  if (files.empty()) return false;
  try {
    SourcePtr file = open_file_source(files.front());
    uint64_t data_start = 0;
    return safetensors::read_header(*file, data_start).metadata.count(kShardingInfo) > 0;
  } catch (const Error&) {
    return false;  // not readable as safetensors: not this format (the reader says why if chosen)
  }
}

CheckpointModel read_dcp_hf_dir(const std::string& dir, ProblemSink* sink) {
  CheckpointModel model;
  model.source = dir;
  std::vector<std::string> files = list_safetensors(dir);
  if (files.empty()) fail(ErrorCode::kNotFound, dir + ": no .safetensors file");
  std::vector<std::string> order;  // FQNs in the first file's sharding order
  std::set<std::string> ordered;   // the same, for lookups (a model has 10^5 tensors)
  std::map<std::string, std::vector<Piece>> pieces;
  int max_rank = -1;
  for (const auto& path : files) {
    int rank = rank_of(path);
    max_rank = std::max(max_rank, rank);
    run_reporting(sink, path, rank, "", [&] {
      with_context(path, [&] {
        SourcePtr file = open_mapped_source(path);
        uint64_t data_start = 0;
        safetensors::Header header = safetensors::read_header(*file, data_start);
        auto info_text = header.metadata.find(kShardingInfo);
        if (info_text == header.metadata.end())
          fail_data_loss(std::string("no ") + kShardingInfo +
                         " in its __metadata__: not a file of this DCP Hugging Face checkpoint");
        Json info = parse_checkpoint_json(info_text->second, kShardingInfo);
        const JsonMembers placed_at(info, kShardingInfo);
        if (auto v = header.metadata.find("DCP_VERSION"); v != header.metadata.end())
          model.facts["dcp_version"] = v->second;
        for (auto it = info.begin(); it != info.end(); ++it)
          if (ordered.insert(it.key()).second) order.push_back(it.key());
        for (const auto& h : header.tensors) {
          const Json* placed = placed_at.find(h.name);
          const Json* offsets = nullptr;
          if (placed && placed->is_object())
            for (const auto& [field, value] : placed->items())
              if (field == "saved_offsets") offsets = &value;
          if (!offsets || !offsets->is_array() || offsets->size() != h.shape.size()) {
            report_or_fail(sink, {ErrorCode::kDataLoss,
                                  path + ": tensor '" + h.name + "' has no saved_offsets of rank " +
                                      std::to_string(h.shape.size()) + " in " + kShardingInfo,
                                  path, rank, h.name});
            continue;
          }
          Piece p;
          p.dtype = h.dtype;
          for (const auto& o : *offsets) {
            if (!o.is_number_unsigned()) fail_data_loss("tensor '" + h.name + "': saved_offsets holds " + o.dump());
            p.chunk.offsets.push_back(o.get<int64_t>());
          }
          p.chunk.sizes = h.shape;
          p.chunk.strides = contiguous_strides(h.shape);
          p.chunk.storage = make_sub_source(file, data_start + h.begin, h.end - h.begin);
          p.chunk.file = path;
          p.chunk.rank = rank;
          if (ordered.insert(h.name).second) order.push_back(h.name);
          pieces[h.name].push_back(std::move(p));
        }
      });
    });
  }
  auto root = pickle::Value::dict();
  for (const auto& name : order) {
    auto found = pieces.find(name);
    if (found == pieces.end()) continue;  // placed in the sharding info of no file that holds it
    TensorEntry t;
    t.name = name;
    t.dtype = found->second.front().dtype;
    t.storage = StorageKind::kDTensor;
    t.sharding = "DCP Hugging Face pieces";
    t.shape.assign(found->second.front().chunk.sizes.size(), 0);
    bool sound = true;
    for (auto& p : found->second) {
      if (p.dtype != t.dtype) {
        report_or_fail(sink,
                       {ErrorCode::kDataLoss,
                        p.chunk.file + ": tensor '" + name + "' is " + std::string(dtype_name(p.dtype)) + " here but " +
                            std::string(dtype_name(t.dtype)) + " in " + found->second.front().chunk.file,
                        p.chunk.file, p.chunk.rank, name});
        sound = false;
        continue;
      }
      if (p.chunk.sizes.size() != t.shape.size()) {
        report_or_fail(sink, {ErrorCode::kDataLoss,
                              p.chunk.file + ": tensor '" + name + "' has " + std::to_string(p.chunk.sizes.size()) +
                                  " dimensions here, " + std::to_string(t.shape.size()) + " elsewhere",
                              p.chunk.file, p.chunk.rank, name});
        sound = false;
        continue;
      }
      // Each dimension: the largest offset + size (torch's HuggingFaceStorageReader).
      for (std::size_t d = 0; d < t.shape.size(); ++d)
        t.shape[d] = std::max<int64_t>(
            t.shape[d], static_cast<int64_t>(checked_add(static_cast<uint64_t>(p.chunk.offsets[d]),
                                                         static_cast<uint64_t>(p.chunk.sizes[d]), "extent")));
      if (shape_numel(p.chunk.sizes) > 0) t.chunks.push_back(std::move(p.chunk));
    }
    if (!sound) continue;
    t.world_size = max_rank + 1;
    root->entries.emplace_back(pickle::Value::str(name), make_tensor_ref(model.tensors.size()));
    model.tensors.push_back(std::move(t));
  }
  model.root = root;
  model.info.kind = SourceKind::kDcpHf;
  model.info.files = files;
  model.info.flat_keys = true;
  if (max_rank >= 0) model.info.world_sizes = {max_rank + 1};
  model.facts["world_size"] = std::to_string(max_rank + 1);
  return model;
}

}  // namespace ckpt::dcp_hf
