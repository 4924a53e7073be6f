#include "formats/safetensors/safetensors_reader.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "core/problems.h"
#include "formats/safetensors/hf_config.h"
#include "formats/safetensors/hf_tied_weights.h"
#include "formats/safetensors/safetensors_format.h"
#include "formats/torch_pt/pt_reader.h"
#include "io/storage.h"
#include "model/ordered_json.h"
#include "model/tree_walk.h"
#include "model/value_json.h"

namespace ckpt::safetensors {
namespace {

using Json = nlohmann::ordered_json;
using pickle::Value;
using pickle::ValuePtr;

constexpr int kMaxDepth = 200;

// Every {"__tensor__": name} the tree holds, into `names`.
void tree_tensor_names(const Json& j, std::set<std::string>& names, int depth) {
  if (depth > kMaxDepth) fail_data_loss("ckptconv.tree nests too deeply");
  if (j.is_object()) {
    auto it = j.find("__tensor__");
    if (j.size() == 1 && it != j.end() && it->is_string()) {
      names.insert(it->get<std::string>());
      return;
    }
    for (const auto& v : j) tree_tensor_names(v, names, depth + 1);
  } else if (j.is_array()) {
    for (const auto& v : j) tree_tensor_names(v, names, depth + 1);
  }
}

// Collects the tensors of one or more files (the shards of one state dict)
// and builds the model's tree once all are in.
class ModelBuilder {
 public:
  ModelBuilder(const std::string& source, ProblemSink* sink) : sink_(sink) { model_.source = source; }

  void add_file(const std::string& path) {
    with_context(path, [&] {
      SourcePtr file = open_mapped_source(path);
      uint64_t data_start = 0;
      Header header = read_header(*file, data_start);
      for (const auto& h : header.tensors) add_tensor(h, file, data_start, path);
      for (const auto& [k, v] : header.metadata) {
        if (k == "ckptconv.tree") {
          if (!tree_) {
            tree_ = v;
            tree_file_ = path;
          } else if (*tree_ != v && tree_conflict_.empty()) {
            tree_conflict_ = tree_file_ + " and " + path +
                             " carry different ckptconv.tree metadata: they are not shards of one state dict";
          }
        } else if (k != "ckptconv.values") {
          model_.facts["metadata." + k] = v;
        }
      }
    });
  }

  // The files are the whole source (a folder without an index): a tree
  // naming a tensor none of them holds means a file is missing.
  void require_whole() { whole_ = true; }

  CheckpointModel finish() && {
    if (!tree_conflict_.empty()) fail(ErrorCode::kUnimplemented, tree_conflict_ + "; read the files apart");
    Json j;
    if (tree_) {
      j = with_context(tree_file_,
                       [&] { return parse_ordered_json(*tree_, kMaxDepth + 1, "__metadata__ ckptconv.tree"); });
    }
    if (tree_ && follow_tree(j)) {
      model_.root = value_from_json(
          j,
          [&](const Json& ref) {
            if (!ref.is_string()) fail_data_loss("ckptconv.tree: __tensor__ is not a tensor name");
            return make_tensor_ref(by_name_.at(ref.get<std::string>()));
          },
          kMaxDepth);
      prune_unreferenced(model_.root, model_.tensors);
    } else {
      model_.root = Value::dict(std::move(flat_));
      model_.info.flat_keys = true;
    }
    return std::move(model_);
  }

 private:
  // The tree ckptconv wrote is the state dict only when it names every
  // tensor read: a tree naming fewer (a file of ckptconv's beside other
  // files) would drop the others, so it is refused. One naming more is one
  // shard of a sharded output read alone: its tensors are read as stored
  // (flat), unless the files are the whole source.
  bool follow_tree(const Json& tree) {
    std::set<std::string> named;
    tree_tensor_names(tree, named, 0);
    std::size_t unnamed = 0;
    const TensorEntry* first = nullptr;
    for (const auto& t : model_.tensors)
      if (!named.count(t.name) && !unnamed++) first = &t;
    if (first)  // unsupported, not corrupt: validate too cannot vouch for what these files hold (exit 3)
      fail(ErrorCode::kUnimplemented,
           tree_file_ + ": its ckptconv.tree (the state dict ckptconv wrote) does not name tensor '" + first->name +
               "' of " + first->chunks.at(0).file +
               (unnamed > 1 ? " (nor " + std::to_string(unnamed - 1) + " more)" : "") +
               ": the tree describes only part of the files read, and following it would drop the rest; read "
               "the files apart");
    std::vector<std::string> absent;
    for (const auto& n : named)
      if (!by_name_.count(n)) absent.push_back(n);
    if (absent.empty()) return true;
    if (whole_)
      report_or_fail(sink_, {ErrorCode::kDataLoss,
                             tree_file_ + ": its ckptconv.tree names tensor '" + absent.front() + "'" +
                                 (absent.size() > 1 ? " (and " + std::to_string(absent.size() - 1) + " more)" : "") +
                                 " that no file here holds: a file of the checkpoint is missing",
                             tree_file_, -1, absent.front()});
    return false;
  }

  void add_tensor(const HeaderTensor& h, const SourcePtr& file, uint64_t data_start, const std::string& path) {
    if (by_name_.count(h.name)) {
      const std::string& first = model_.tensors[by_name_[h.name]].chunks[0].file;
      std::string where =
          first == path ? "is named twice in the header" : "is in two shards (" + first + " and " + path + ")";
      return report_or_fail(sink_, {ErrorCode::kDataLoss, "tensor '" + h.name + "' " + where, path, -1, h.name});
    }
    TensorEntry t;
    t.name = h.name;
    t.dtype = h.dtype;
    t.shape = h.shape;
    TensorChunk c;
    c.offsets.assign(h.shape.size(), 0);
    c.sizes = h.shape;
    c.storage = make_sub_source(file, data_start + h.begin, h.end - h.begin);
    c.strides = contiguous_strides(h.shape);
    c.file = path;
    t.chunks.push_back(std::move(c));
    by_name_[h.name] = model_.tensors.size();
    flat_.emplace_back(Value::str(h.name), make_tensor_ref(model_.tensors.size()));
    model_.tensors.push_back(std::move(t));
  }

  CheckpointModel model_;
  std::map<std::string, std::size_t> by_name_;
  std::vector<std::pair<ValuePtr, ValuePtr>> flat_;
  std::optional<std::string> tree_;
  std::string tree_file_;      // the first file carrying tree_
  std::string tree_conflict_;  // two files carrying different trees
  bool whole_ = false;
  ProblemSink* sink_;
};

constexpr uint64_t kMaxIndexSize = 100'000'000;

namespace fs = std::filesystem;

// A Hugging Face index (<weights>.index.json): its weight_map and the files
// it names, in the order of their names (model-00001-of-...), each once.
struct WeightIndex {
  Json index;
  const Json* map = nullptr;
  std::set<std::string> files;
};

void read_weight_index(const std::string& path, WeightIndex& out) {
  SourcePtr src = open_file_source(path);
  if (src->size() > kMaxIndexSize) fail_data_loss("index larger than " + std::to_string(kMaxIndexSize) + " bytes");
  out.index = parse_checkpoint_json(src->read_string(0, static_cast<std::size_t>(src->size())), "the index");
  if (!out.index.is_object()) fail_data_loss("not a JSON object");
  out.map = JsonMembers(out.index, "the index").find("weight_map");
  if (!out.map || !out.map->is_object()) fail_data_loss("no weight_map object");
  // An index that lists nothing would read as an empty checkpoint however
  // many shards lie beside it.
  if (out.map->empty()) fail_data_loss("weight_map lists no tensor");
  for (const auto& file : *out.map) {
    if (!file.is_string()) fail_data_loss("weight_map value is not a file name");
    const std::string& name = file.get_ref<const std::string&>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      fail(ErrorCode::kUnsafe, "weight_map names '" + name + "', not a file beside the index");
    out.files.insert(name);
  }
}

// The index must agree with what the shards hold (`held`: tensor -> the
// name of the shard holding it, in the shards' order): a tensor listed in
// another shard, listed but held nowhere (its shard read), or held but not
// listed is DataLoss, reported to `sink` when there is one.
void check_weight_map(const Json& map, const std::vector<std::pair<std::string, std::string>>& held,
                      const fs::path& dir, const std::set<std::string>& unreadable, ProblemSink* sink) {
  const JsonMembers listed_in(map, "weight_map");
  std::unordered_map<std::string, std::string> where;  // tensor -> the shard that holds it
  where.reserve(held.size());
  for (const auto& [tensor, shard] : held) where.emplace(tensor, shard);
  for (const auto& [tensor, file] : map.items()) {
    const std::string& listed = file.get_ref<const std::string&>();
    auto h = where.find(tensor);
    if (h == where.end() && !unreadable.count(listed))
      report_or_fail(sink, {ErrorCode::kDataLoss,
                            "weight_map lists tensor '" + tensor + "' that no shard holds (" + listed + " does not)",
                            (dir / listed).string(), -1, tensor});
    else if (h != where.end() && h->second != listed)
      report_or_fail(sink, {ErrorCode::kDataLoss,
                            "weight_map puts tensor '" + tensor + "' in " + listed + ", but " + h->second +
                                " holds it: the index does not match the shards",
                            (dir / h->second).string(), -1, tensor});
  }
  for (const auto& [tensor, shard] : held)
    if (!listed_in.find(tensor))
      report_or_fail(sink, {ErrorCode::kDataLoss,
                            shard + " holds tensor '" + tensor +
                                "', which the index does not list: the index does not match the shards",
                            (dir / shard).string(), -1, tensor});
}

// The state dicts of torch.save files, the shards of one model, as one
// dict: a name in two shards is DataLoss, as for safetensors.
class BinModelBuilder {
 public:
  BinModelBuilder(const std::string& source, ProblemSink* sink) : sink_(sink) { model_.source = source; }

  void add_file(const std::string& path) {
    with_context(path, [&] {
      pickle::ValuePtr root = adopt(model_, torch_pt::read_pt_file(path, sink_));
      pickle::ValuePtr dict = root ? mapping_of(root) : nullptr;
      if (!dict || !dict->is(pickle::Kind::kDict)) fail_data_loss("not a state dict (a dict of tensors by name)");
      for (const auto& [k, v] : dict->entries) {
        if (!k->is(pickle::Kind::kStr)) fail_data_loss("a state dict key that is not a str");
        auto [first, fresh] = where_.emplace(k->text, path);
        if (!fresh) {
          report_or_fail(sink_, {ErrorCode::kDataLoss,
                                 "tensor '" + k->text + "' is in two shards (" + first->second + " and " + path + ")",
                                 path, -1, k->text});
          continue;
        }
        entries_.emplace_back(k, v);
        held_.emplace_back(k->text, fs::path(path).filename().string());
      }
    });
  }

  // tensor -> the name of the shard holding it, in the shards' order.
  const std::vector<std::pair<std::string, std::string>>& held() const { return held_; }

  CheckpointModel finish() && {
    model_.root = pickle::Value::dict(std::move(entries_));
    prune_unreferenced(model_.root, model_.tensors);  // a name read twice keeps its first tensor
    return std::move(model_);
  }

 private:
  CheckpointModel model_;
  std::unordered_map<std::string, std::string> where_;  // name -> the file holding it
  std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>> entries_;
  std::vector<std::pair<std::string, std::string>> held_;
  ProblemSink* sink_;
};

// pytorch_model.bin, or a shard pytorch_model-00001-of-00003.bin: the
// weights transformers' save_pretrained wrote before safetensors (and
// huggingface_hub's save_torch_state_dict with safe_serialization=False).
bool is_bin_weights_name(const std::string& name) {
  if (name == "pytorch_model.bin") return true;
  const std::string prefix = "pytorch_model-", suffix = ".bin";
  if (name.size() != prefix.size() + 14 + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix))
    return false;
  std::string_view mid = std::string_view(name).substr(prefix.size(), 14);  // 00001-of-00003
  for (std::size_t i = 0; i < mid.size(); ++i)
    if (i >= 5 && i < 9 ? mid[i] != "-of-"[i - 5] : !std::isdigit(static_cast<unsigned char>(mid[i]))) return false;
  return true;
}

// A PEFT adapter (get_peft_model(...).save_pretrained): never the model's.
bool is_adapter_name(const std::string& name) {
  return name == "adapter_model.safetensors" || name == "adapter_model.bin";
}

// With several indexes, the one named `main`; else InvalidArgument naming them.
// from_pretrained reads the single weights file when the folder has one and
// then never looks at an index or shards beside it (a stale sharded save):
// modeling_utils._get_resolved_checkpoint_files tries model.safetensors,
// then its index, then pytorch_model.bin, then its index. So do we, saying
// what is left unread. Returns the single file when it decides.
std::optional<std::string> single_weights_file(const std::string& dir, const std::vector<std::string>& weights,
                                               const std::vector<std::string>& indexes, const std::string& name) {
  auto it = std::find_if(weights.begin(), weights.end(), [&](const auto& p) { return fs::path(p).filename() == name; });
  if (it == weights.end()) return std::nullopt;
  std::string unread;
  for (const auto* v : {&indexes, &weights})
    for (const auto& p : *v)
      if (p != *it) unread += (unread.empty() ? "" : ", ") + fs::path(p).filename().string();
  if (!unread.empty())
    log::warn(dir + ": " + name + " is the model, as from_pretrained reads it; not read beside it: " + unread);
  return *it;
}

std::string the_index(const std::string& dir, const std::vector<std::string>& indexes, const std::string& main,
                      const std::string& kind) {
  if (indexes.size() == 1) return indexes.front();
  for (const auto& i : indexes)
    if (fs::path(i).filename() == main) return i;
  std::string names;
  for (const auto& i : indexes) names += (names.empty() ? "" : ", ") + fs::path(i).filename().string();
  fail_invalid(dir + " holds several " + kind + " indexes (" + names + "): pass the one to read");
}

// "model-00002-of-00003.safetensors" -> {"model", ".safetensors", 2, 3}
// ("pytorch_model-00001-of-00002.bin" alike); nullopt for any other name.
// transformers' save_pretrained numbers shards this way (five digits each).
struct NumberedShard {
  std::string prefix, ext;
  std::size_t index = 0, total = 0;
};
// Parsed by hand: a file name is the checkpoint's, and the standard
// library's regular expressions recurse per character of their subject.
std::optional<NumberedShard> numbered_shard(std::string_view name) {
  std::string_view ext;
  for (std::string_view e : {std::string_view(".safetensors"), std::string_view(".bin")})
    if (name.ends_with(e)) ext = e;
  // "-NNNNN-of-NNNNN" is 15 characters before the extension.
  if (ext.empty() || name.size() < ext.size() + 15) return std::nullopt;
  std::string_view tail = name.substr(name.size() - ext.size() - 15, 15);
  auto digits = [](std::string_view d, std::size_t& out) {
    out = 0;
    for (char c : d) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + static_cast<std::size_t>(c - '0');
    }
    return true;
  };
  NumberedShard s;
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-" || !digits(tail.substr(1, 5), s.index) ||
      !digits(tail.substr(10, 5), s.total))
    return std::nullopt;
  if (s.index == 0 || s.index > s.total) return std::nullopt;
  s.prefix = std::string(name.substr(0, name.size() - ext.size() - 15));
  s.ext = std::string(ext);
  return s;
}

std::string shard_name(const NumberedShard& s) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu", s.index, s.total);
  return s.prefix + buf + s.ext;
}

std::size_t shard_total(const std::string& path) {
  auto s = numbered_shard(fs::path(path).filename().string());
  return s ? s->total : 0;
}

std::vector<std::string> missing_numbered_shards(const std::vector<std::string>& paths) {
  // (prefix, extension, total) -> the indices present, and the folder they lie in.
  using Series = std::tuple<std::string, std::string, std::size_t>;
  std::map<Series, std::set<std::size_t>> present;
  std::map<Series, fs::path> folder;
  for (const auto& p : paths) {
    auto s = numbered_shard(fs::path(p).filename().string());
    if (!s) continue;
    Series key{s->prefix, s->ext, s->total};
    present[key].insert(s->index);
    folder[key] = fs::path(p).parent_path();
  }
  std::vector<std::string> missing;
  for (const auto& [key, indices] : present) {
    const auto& [prefix, ext, total] = key;
    for (std::size_t i = 1; i <= total; ++i)
      if (!indices.count(i))
        missing.push_back((folder[key] / shard_name(NumberedShard{prefix, ext, i, total})).string());
  }
  return missing;
}

// Without an index, shards named "-00002-of-00003" say how many there are:
// one missing is a hole in the model that nothing else would notice.
void report_missing_shards(const std::vector<std::string>& paths, ProblemSink* sink) {
  for (const auto& missing : missing_numbered_shards(paths))
    report_or_fail(sink, Problem(ErrorCode::kNotFound,
                                 missing +
                                     ": no such shard: the folder has no index, and its shards' names say "
                                     "there are " +
                                     std::to_string(shard_total(missing)),
                                 missing));
}

CheckpointModel read_bin_weights(const std::string& dir, const HfFolderFiles& files, ProblemSink* sink) {
  BinModelBuilder builder(dir, sink);
  std::vector<std::string> read;
  if (auto single = single_weights_file(dir, files.bin_weights, files.bin_indexes, "pytorch_model.bin")) {
    if (run_reporting(sink, *single, -1, "", [&] { builder.add_file(*single); })) read.push_back(*single);
    CheckpointModel model = std::move(builder).finish();
    model.info.files = read;
    return model;
  }
  if (!files.bin_indexes.empty()) {
    std::string path = the_index(dir, files.bin_indexes, "pytorch_model.bin.index.json", "pytorch_model.bin");
    return with_context(path, [&] {
      WeightIndex index;
      read_weight_index(path, index);
      std::set<std::string> unreadable;
      read.push_back(path);
      for (const auto& name : index.files) {
        std::string shard = (fs::path(dir) / name).string();
        if (run_reporting(sink, shard, -1, "", [&] { builder.add_file(shard); }))
          read.push_back(shard);
        else
          unreadable.insert(name);
      }
      std::vector<std::pair<std::string, std::string>> held = builder.held();
      CheckpointModel model = std::move(builder).finish();
      check_weight_map(*index.map, held, dir, unreadable, sink);
      model.info.files = read;
      return model;
    });
  }
  report_missing_shards(files.bin_weights, sink);
  for (const auto& w : files.bin_weights)
    if (run_reporting(sink, w, -1, "", [&] { builder.add_file(w); })) read.push_back(w);
  CheckpointModel model = std::move(builder).finish();
  model.info.files = read;
  return model;
}

}  // namespace

CheckpointModel read_safetensors_file(const std::string& path) {
  ModelBuilder builder(path, nullptr);
  builder.add_file(path);
  return std::move(builder).finish();
}

bool is_safetensors_index(const std::string& path) { return path.ends_with(".safetensors.index.json"); }

CheckpointModel read_safetensors_index(const std::string& path, ProblemSink* sink) {
  return with_context(path, [&] {
    WeightIndex index;
    read_weight_index(path, index);
    fs::path dir = fs::path(path).parent_path();
    ModelBuilder builder(path, sink);
    std::set<std::string> unreadable;
    for (const auto& name : index.files) {
      std::string shard = (dir / name).string();
      if (!run_reporting(sink, shard, -1, "", [&] { builder.add_file(shard); })) unreadable.insert(name);
    }
    CheckpointModel model = std::move(builder).finish();
    std::vector<std::pair<std::string, std::string>> held;
    held.reserve(model.tensors.size());
    for (const auto& t : model.tensors) held.emplace_back(t.name, fs::path(t.chunks.at(0).file).filename().string());
    check_weight_map(*index.map, held, dir, unreadable, sink);
    return model;
  });
}

bool is_weights_file_name(const std::string& name) {
  static const char* const kWeights[] = {".safetensors", ".bin", ".pt",   ".pth",  ".ckpt", ".h5",        ".hdf5",
                                         ".msgpack",     ".npz", ".gguf", ".onnx", ".pkl",  ".index.json"};
  for (const char* ext : kWeights)
    if (name.ends_with(ext)) return true;
  return false;
}

HfFolderFiles list_hf_folder(const std::string& dir) {
  HfFolderFiles out;
  for (const DirEntry& entry : list_directory(dir)) {
    if (!entry.is_file()) continue;
    const std::string& name = entry.name;
    if (is_safetensors_index(name))
      out.indexes.push_back(entry.path);
    else if (is_adapter_name(name))
      out.adapters.push_back(entry.path);
    else if (name.ends_with(".safetensors"))
      out.weights.push_back(entry.path);
    else if (name.ends_with(".bin.index.json"))
      out.bin_indexes.push_back(entry.path);
    else if (is_bin_weights_name(name))
      out.bin_weights.push_back(entry.path);
    else
      out.others.push_back(name);
  }
  for (auto* v : {&out.indexes, &out.weights, &out.bin_indexes, &out.bin_weights, &out.adapters, &out.others})
    std::sort(v->begin(), v->end());
  return out;
}

// config.json's transformers_weights names the model's weights file (or
// index): from_pretrained reads it and nothing else, whatever lies beside it.
void use_explicit_weights(const std::string& dir, const HfConfig& config, const std::string& named,
                          HfFolderFiles& files) {
  const std::string shown = printable_text(fs::path(named).lexically_relative(dir).string());
  if (!is_regular_file(named))
    fail(ErrorCode::kNotFound, config.path + ": transformers_weights names " + shown +
                                   ", which is not in the folder: from_pretrained reads that file and no other");
  std::string unread;
  for (const auto* v : {&files.indexes, &files.weights, &files.bin_indexes, &files.bin_weights})
    for (const auto& p : *v)
      if (p != named) unread += (unread.empty() ? "" : ", ") + fs::path(p).filename().string();
  if (!unread.empty())
    log::warn(dir + ": " + shown + " is the model, as config.json's transformers_weights names it for from_pretrained" +
              "; not read beside it: " + unread);
  files.indexes.clear();
  files.weights.clear();
  files.bin_indexes.clear();
  files.bin_weights.clear();
  (named.ends_with(".safetensors.index.json") ? files.indexes : files.weights).push_back(named);
}

CheckpointModel read_hf_folder(const std::string& dir, ProblemSink* sink) {
  HfFolderFiles files = list_hf_folder(dir);
  const HfConfig config = read_hf_config(dir);
  if (auto named = explicit_weights_file(config, dir)) {
    use_explicit_weights(dir, config, *named, files);
  } else if (auto single = single_weights_file(dir, files.weights, files.indexes, "model.safetensors")) {
    // First in from_pretrained's order: pytorch_model.bin beside it is not
    // read either (it had been, as if model.safetensors were missing).
    std::string bins;
    for (const auto* v : {&files.bin_weights, &files.bin_indexes})
      for (const auto& p : *v) bins += (bins.empty() ? "" : ", ") + fs::path(p).filename().string();
    if (!bins.empty())
      log::warn(dir +
                ": model.safetensors is the model, as from_pretrained reads it first; not read beside it: " + bins);
    files.weights = {*single};
    files.indexes.clear();
    files.bin_weights.clear();
    files.bin_indexes.clear();
  }
  CheckpointModel model;
  if (!files.indexes.empty()) {
    std::string index = the_index(dir, files.indexes, "model.safetensors.index.json", "safetensors");
    model = read_safetensors_index(index, sink);
    std::set<std::string> read{index};
    for (const auto& t : model.tensors) read.insert(t.chunks.at(0).file);
    model.info.files.assign(read.begin(), read.end());
  } else if (files.has_bin_model()) {
    // With neither model.safetensors nor an index, from_pretrained reads
    // pytorch_model.bin (or its index), whatever other .safetensors lie here.
    if (!files.weights.empty()) {
      std::string unread;
      for (const auto& w : files.weights) unread += (unread.empty() ? "" : ", ") + fs::path(w).filename().string();
      log::warn(dir + ": the pytorch_model.bin weights are the model, as from_pretrained reads them without " +
                "model.safetensors or an index; not read beside them: " + unread);
    }
    model = read_bin_weights(dir, files, sink);
  } else if (!files.weights.empty()) {
    // Without an index the files together are the model (a tensor in two of
    // them is DataLoss, as with an index).
    report_missing_shards(files.weights, sink);
    ModelBuilder builder(dir, sink);
    std::size_t read = 0;
    for (const auto& w : files.weights) read += run_reporting(sink, w, -1, "", [&] { builder.add_file(w); });
    if (read == files.weights.size()) builder.require_whole();
    model = std::move(builder).finish();
    model.info.files = files.weights;
  } else if (!files.adapters.empty()) {
    fail_invalid(dir + " holds a PEFT adapter (" + fs::path(files.adapters.front()).filename().string() +
                 ") and no model weights: an adapter is not read as the model; name its file to read it alone (" +
                 files.adapters.front() + ")");
  } else {
    fail(ErrorCode::kNotFound, dir + ": no .safetensors file and no index");
  }
  model.source = dir;
  // What was not read is listed; what is no weights is carried by -o DIR/
  // (not adapter_config.json: an export holds no adapter).
  std::set<std::string> read;  // every file read lies in `dir`
  for (const auto& f : model.info.files) read.insert(fs::path(f).filename().string());
  std::string not_read;
  std::vector<std::string> names;
  for (const DirEntry& entry : list_directory(dir))
    if (entry.is_file() && !read.count(entry.name)) names.push_back(entry.name);
  for (const auto& o : names) {
    not_read += (not_read.empty() ? "" : ", ") + o;
    if (!is_weights_file_name(o) && o != "adapter_config.json")
      model.info.side_files.push_back((fs::path(dir) / o).string());
  }
  if (!not_read.empty()) model.facts["hf_folder_files"] = not_read;
  if (!files.adapters.empty()) {
    std::string adapters;
    for (const auto& a : files.adapters) adapters += (adapters.empty() ? "" : ", ") + fs::path(a).filename().string();
    model.facts["hf_adapter"] = adapters +
                                ": a PEFT adapter (adapter_config.json), not part of the model; read it alone as " +
                                files.adapters.front();
    log::info(dir + ": " + adapters + " is a PEFT adapter, not part of the model: not read (name the file to read it)");
  }
  add_tied_weights(model, config);
  return model;
}

}  // namespace ckpt::safetensors
