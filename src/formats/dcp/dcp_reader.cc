#include "formats/dcp/dcp_reader.h"

#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>

#include "core/checked.h"
#include "core/error.h"
#include "core/linear_regex.h"
#include "core/problems.h"
#include "formats/dcp/dcp_metadata.h"
#include "formats/torch_pt/pt_reader.h"
#include "io/containment.h"
#include "io/storage.h"
#include "model/tree_walk.h"
#include "model/unflatten.h"
#include "pickle/unpickler.h"

namespace ckpt::dcp {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// A relative_path from the metadata must name a file inside the directory.
void check_relative_path(const std::string& path) {
  if (path.empty() || path[0] == '/' || path.find('\\') != std::string::npos)
    fail(ErrorCode::kUnsafe, "storage path '" + path + "' is not a relative path inside the checkpoint");
  for (const auto& part : fs::path(path))
    if (part == "..") fail(ErrorCode::kUnsafe, "storage path '" + path + "' escapes the checkpoint directory");
}

int rank_of_file(const std::string& name) {
  // At most 6 digits (no job has a million ranks): the number always fits an int.
  static const LinearRegex kDistcp = LinearRegex::compile(R"(__(\d{1,6})_(\d{1,6})\.distcp)");
  RegexMatch m;
  if (kDistcp.match(name, m)) return std::stoi(m.str(1));
  return -1;
}

// Bytes items (param_groups, a dataloader's state) declare no size: their
// decompressed bytes are bounded by this budget instead (the default
// --memory-limit; real ones hold kilobytes).
constexpr uint64_t kMaxBytesItem = uint64_t{256} << 20;
// A tensor item is a torch.save zip of one chunk: its records besides the
// chunk's bytes (data.pkl, version, byteorder, alignment padding) stay well
// below this.
constexpr uint64_t kTensorItemOverhead = uint64_t{1} << 20;

// A zstd frame need not declare its content size, so the stream is
// decompressed piece by piece and stopped as soon as it exceeds `limit`: a
// small hostile item cannot make the reader allocate more than the item
// itself declares it holds.
std::string zstd_decompress(const ByteSource& src, uint64_t limit) {
  std::string in = src.read_string(0, static_cast<std::size_t>(src.size()));
  std::string out;
  ZSTD_DStream* ds = ZSTD_createDStream();
  ZSTD_initDStream(ds);
  ZSTD_inBuffer input{in.data(), in.size(), 0};
  std::vector<char> buf(ZSTD_DStreamOutSize());
  std::size_t ret = 1;
  while (input.pos < input.size) {
    ZSTD_outBuffer output{buf.data(), buf.size(), 0};
    ret = ZSTD_decompressStream(ds, &output, &input);
    if (ZSTD_isError(ret)) {
      ZSTD_freeDStream(ds);
      fail_data_loss(src.describe() + ": zstd: " + ZSTD_getErrorName(ret));
    }
    if (output.pos > limit - out.size()) {
      ZSTD_freeDStream(ds);
      fail(ErrorCode::kUnsafe, src.describe() + ": zstd item decompresses to more than " + std::to_string(limit) +
                                   " bytes, more than the item declares it holds; refusing to inflate it");
    }
    out.append(buf.data(), output.pos);
  }
  ZSTD_freeDStream(ds);
  if (ret != 0) fail_data_loss(src.describe() + ": zstd stream is truncated");
  return out;
}

// The files of a DCP directory: its metadata files and every .distcp in it
// (those the metadata does not name included: validate reports them).
std::vector<std::string> list_dcp_files(const std::string& dir) {
  static const LinearRegex kDcpFile = LinearRegex::compile(R"(\.metadata|__\d+\.metadata|.*\.distcp)");
  std::vector<std::string> out;
  for (const DirEntry& e : list_directory(dir))
    if (e.is_file() && kDcpFile.match(e.name)) out.push_back(e.path);
  return out;
}

class DcpDirReader {
 public:
  DcpDirReader(std::string dir, ProblemSink* sink, const pickle::GlobalPolicy& bytes_policy)
      : dir_(std::move(dir)), sink_(sink), bytes_policy_(bytes_policy) {}

  CheckpointModel read() {
    DcpMetadata md = load_metadata();
    CheckpointModel model;
    model.source = dir_;
    model.facts["dcp_metadata_version"] = md.version.empty() ? "none (torch < 2.4)" : md.version;
    model.facts["storage_meta"] = md.has_storage_meta ? "yes" : "no";
    model.facts["metadata_files"] = std::to_string(metadata_files_) +
                                    (metadata_files_ == 1 ? " (.metadata)" : " (__<rank>.metadata, no global one)");
    int max_rank = -1;
    for (const auto& [key, info] : md.storage)
      max_rank = std::max(max_rank, rank_of_file(fs::path(info.relative_path).filename().string()));
    if (max_rank >= 0) {
      model.facts["world_size"] = std::to_string(max_rank + 1);
      model.info.world_sizes = {max_rank + 1};
    }
    model.info.kind = SourceKind::kDcpDir;
    model.info.files = list_dcp_files(dir_);
    model.info.flat_layout = flat_layout_of(md);
    if (sink_)
      check_storage_files(md);
    else
      check_item_overlaps(md);
    model.info.declared = declared_contents(md);
    plan_header_ranges(md);
    Unflattener tree;
    for (std::size_t i = 0; i < md.items.size(); ++i) {
      for (std::size_t ahead = i == 0 ? 0 : kPrefetchItems; ahead <= kPrefetchItems; ++ahead)
        if (i + ahead < md.items.size()) prefetch_zip_ends(md.items[i + ahead], md);
      const ItemMeta& item = md.items[i];
      if (sink_ && in_unreadable_file(item, md)) continue;  // reported once for its file
      ValuePtr value = item.is_tensor ? read_tensor(item, md, model) : read_bytes(item, md, model);
      if (!value) continue;  // reported to the sink
      auto pd = md.planner_data.find(item.fqn);
      if (pd != md.planner_data.end()) {
        // dcp.save names a key by its path joined with dots; a path that
        // names another key would put the value elsewhere (torch's loader
        // refuses it). Joined as torch joins it (".".join(map(str, path))),
        // an empty component included: {"model": {"": t}} is 'model.', which
        // had been refused as naming 'model'.
        std::string joined;
        for (std::size_t k = 0; k < pd->second.size(); ++k) joined += (k ? "." : "") + path_component(*pd->second[k]);
        if (joined != item.fqn) {
          report_or_fail(sink_, Problem{ErrorCode::kDataLoss,
                                        dir_ + "/.metadata: the planner_data path of '" + item.fqn + "' names '" +
                                            joined + "', another key",
                                        dir_ + "/.metadata", -1, item.fqn});
          continue;
        }
        tree.set(pd->second, value);
      } else
        tree.set({Value::str(item.fqn)}, value);
    }
    model.root = tree.root();
    merge_meta_file(model);
    return model;
  }

  // Lightning's FSDP/ModelParallel strategies save the user's other state
  // (epoch, global_step, loops, callbacks) as meta.pt beside the DCP items;
  // its consolidate_checkpoint loads the items, then update()s the dict with
  // meta.pt's entries. Read the same way, through the safe unpickler.
  void merge_meta_file(CheckpointModel& model) {
    fs::path meta = fs::path(dir_) / "meta.pt";
    if (!is_regular_file(meta.string())) return;
    CheckpointModel extra = torch_pt::read_pt_file(meta.string(), sink_);
    model.info.files.push_back(meta.string());
    std::sort(model.info.files.begin(), model.info.files.end());
    ValuePtr entries = adopt(model, std::move(extra));
    if (!entries || !mapping_of(entries)->is(Kind::kDict) || !model.root->is(Kind::kDict))
      fail_data_loss(meta.string() + ": not a dict of entries to add to the checkpoint (as Lightning saves it)");
    for (const auto& entry : mapping_of(entries)->entries) {
      const std::string name = path_component(*entry.first);
      auto same = std::find_if(model.root->entries.begin(), model.root->entries.end(),
                               [&](const auto& e) { return path_component(*e.first) == name; });
      if (same != model.root->entries.end())
        same->second = entry.second;
      else
        model.root->entries.push_back(entry);
    }
    model.facts["meta_pt"] = "yes (Lightning: its entries are added to the top level)";
  }

  // What the metadata lists: its tensors and their bytes, the files it
  // names (which are missing is known once check_storage_files ran).
  DeclaredContents declared_contents(const DcpMetadata& md) const {
    DeclaredContents d;
    std::set<std::string> files;
    for (const auto& [key, info] : md.storage) files.insert(info.relative_path);
    d.files = files.size() + metadata_files_;
    d.missing_files = unreadable_.size();
    for (const ItemMeta& item : md.items) {
      if (!item.is_tensor) continue;
      ++d.tensors;
      // A count for the report: a size past 64 bits is the tensor's problem,
      // reported with its name by the shape check, not here.
      uint64_t bytes = dtype_size(item.dtype);
      for (int64_t s : item.size) bytes = s < 0 ? UINT64_MAX : saturating_mul(bytes, static_cast<uint64_t>(s));
      d.tensor_bytes = saturating_add(d.tensor_bytes, bytes);
    }
    return d;
  }

 private:
  // validate: every file the metadata names exists and opens (one problem
  // per file, naming the keys stored in it), items of one file do not
  // overlap, and no .distcp file lies in the directory unreferenced.
  void check_storage_files(const DcpMetadata& md) {
    std::map<std::string, std::vector<std::pair<const StorageInfo*, std::string>>> by_file;
    for (const auto& [key, info] : md.storage) by_file[info.relative_path].emplace_back(&info, key.first);
    for (auto& [relative, items] : by_file) {
      int rank = rank_of_file(fs::path(relative).filename().string());
      std::string path = (fs::path(dir_) / relative).string();
      try {
        check_relative_path(relative);
        open(relative);
      } catch (const Error& e) {
        std::string keys;
        for (std::size_t i = 0; i < items.size() && i < 6; ++i) keys += (i ? ", " : "") + items[i].second;
        if (items.size() > 6) keys += " and " + std::to_string(items.size() - 6) + " more";
        sink_->report(Problem{e.code(),
                              std::string(e.what()) + " (rank " + std::to_string(rank) + "; it holds " +
                                  std::to_string(items.size()) + " items of the metadata: " + keys + ")",
                              path, rank, items.front().second});
        unreadable_.insert(relative);
        continue;
      }
      report_overlaps(path, rank, items);
    }
    for (const DirEntry& entry : list_directory(dir_)) {
      if (fs::path(entry.name).extension() != ".distcp" || by_file.count(entry.name)) continue;
      int rank = rank_of_file(entry.name);
      sink_->report(Problem{ErrorCode::kDataLoss,
                            entry.path + ": not referenced by the metadata (a file of another save?)", entry.path, rank,
                            ""});
    }
  }

  // Two items whose bytes overlap in one file (two chunks pointing at the
  // same stored item, say) would copy the same bytes into two places: every
  // command refuses it, validate reports each.
  void report_overlaps(const std::string& path, int rank,
                       std::vector<std::pair<const StorageInfo*, std::string>>& items) {
    std::sort(items.begin(), items.end(),
              [](const auto& a, const auto& b) { return a.first->offset < b.first->offset; });
    for (std::size_t i = 1; i < items.size(); ++i) {
      const StorageInfo& prev = *items[i - 1].first;
      const StorageInfo& cur = *items[i].first;
      if (cur.offset < prev.offset + prev.length)
        report_or_fail(sink_, Problem{ErrorCode::kDataLoss,
                                      path + ": the bytes of '" + items[i].second + "' [" + std::to_string(cur.offset) +
                                          ", +" + std::to_string(cur.length) + ") overlap those of '" +
                                          items[i - 1].second + "' [" + std::to_string(prev.offset) + ", +" +
                                          std::to_string(prev.length) + ") (rank " + std::to_string(rank) + ")",
                                      path, rank, items[i].second});
    }
  }

  void check_item_overlaps(const DcpMetadata& md) {
    std::map<std::string, std::vector<std::pair<const StorageInfo*, std::string>>> by_file;
    for (const auto& [key, info] : md.storage) by_file[info.relative_path].emplace_back(&info, key.first);
    for (auto& [relative, items] : by_file)
      report_overlaps((fs::path(dir_) / relative).string(), rank_of_file(fs::path(relative).filename().string()),
                      items);
  }

  bool in_unreadable_file(const ItemMeta& item, const DcpMetadata& md) const {
    if (unreadable_.empty()) return false;
    // Storage is keyed by (fqn, offsets): the item's entries are adjacent.
    for (auto it = md.storage.lower_bound({item.fqn, {}}); it != md.storage.end() && it->first.first == item.fqn; ++it)
      if (unreadable_.count(it->second.relative_path)) return true;
    return false;
  }

  static DcpMetadata parse_file(const std::string& path) {
    require_inside(path, fs::path(path).parent_path().string());
    SourcePtr src = open_file_source(path);
    ValuePtr raw = pickle::unpickle(*src, pickle::checkpoint_policy());
    return with_context(src->describe(), [&] { return parse_metadata(*raw); });
  }

 public:
  // The global .metadata, or else every rank's __<rank>.metadata merged.
  DcpMetadata load_metadata() {
    fs::path global = fs::path(dir_) / ".metadata";
    if (stat_path(global.string()).resolves()) {
      metadata_files_ = 1;
      return parse_file(global.string());
    }
    std::vector<DcpMetadata> ranks;
    for (int r = 0;; ++r) {
      fs::path p = fs::path(dir_) / ("__" + std::to_string(r) + ".metadata");
      if (!stat_path(p.string()).resolves()) break;
      ++metadata_files_;
      run_reporting(sink_, p.string(), r, "", [&] { ranks.push_back(parse_file(p.string())); });
    }
    if (metadata_files_ == 0) fail(ErrorCode::kNotFound, dir_ + ": no .metadata and no __0.metadata");
    if (ranks.empty())
      fail_data_loss(dir_ + ": none of the " + std::to_string(metadata_files_) +
                     " __<rank>.metadata files could be read");
    return merge_rank_metadata(std::move(ranks), sink_);
  }

 private:
  // The item's bytes: a slice of its .distcp file, decompressed when needed.
  // `max_bytes`: what the item may decompress to (its declared tensor bytes
  // plus the zip around them, or the bytes-item budget).
  SourcePtr item_source(const std::string& fqn, const Shape& offsets, const DcpMetadata& md, int* rank,
                        uint64_t max_bytes) {
    auto it = md.storage.find({fqn, offsets});
    if (it == md.storage.end())
      fail_data_loss("no storage entry for chunk at offsets " + shape_str(offsets) + " in .metadata");
    const StorageInfo& info = it->second;
    check_relative_path(info.relative_path);
    *rank = rank_of_file(fs::path(info.relative_path).filename().string());
    SourcePtr file = open(info.relative_path);
    SourcePtr slice = make_sub_source(file, info.offset, info.length);
    for (const auto& t : info.transforms) {
      if (t.rfind("stream.zstd", 0) == 0) {
        slice = make_memory_source(zstd_decompress(*slice, max_bytes), slice->describe() + " (zstd)");
      } else {
        fail(ErrorCode::kUnimplemented, "item transform '" + t + "' is not supported");
      }
    }
    return slice;
  }

  // Each item is a torch.save zip that is read at both ends: its end
  // records and directory (in its last kZipTail bytes), then its first
  // records (local headers and data.pkl, in its first kZipHead bytes). From
  // an object store each read is a request, waited for. Items follow one
  // another in their file, so one item's end records and the next item's
  // first records are one run of bytes: plan_header_ranges joins them (and
  // the ends of items small enough to lie close together) into ranges of
  // each file, and the reader hints the ranges of the next items while it
  // decodes one: one request per item, several on the wire at once.
  static constexpr std::size_t kPrefetchItems = 3;
  static constexpr uint64_t kZipHead = 4096;             // local header and data.pkl of a tensor item
  static constexpr uint64_t kZipTail = (64 << 10) + 21;  // the end-record search (archive/zip_reader.cc)
  // Bytes between two wanted runs fetched rather than asked for apart (a
  // request costs more than this many bytes on S3 and on moto), and the
  // largest joined range (the object-store source fetches at most 1 MiB
  // for a hint, io/s3_backend.cc).
  static constexpr uint64_t kJoinGap = 256 << 10;
  static constexpr uint64_t kMaxJoined = 1 << 20;

  void plan_header_ranges(const DcpMetadata& md) {
    std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> wanted;
    for (const auto& [key, info] : md.storage) {
      if (!info.transforms.empty() || info.length > UINT64_MAX - info.offset) continue;  // reading it refuses it
      auto& runs = wanted[info.relative_path];
      runs.emplace_back(info.offset, info.offset + std::min(info.length, kZipHead));
      runs.emplace_back(info.offset + info.length - std::min(info.length, kZipTail), info.offset + info.length);
    }
    for (auto& [file, runs] : wanted) {
      std::sort(runs.begin(), runs.end());
      auto& joined = header_ranges_[file];
      for (const auto& [begin, end] : runs) {
        if (!joined.empty() && begin <= joined.back().second + kJoinGap &&
            std::max(end, joined.back().second) - joined.back().first <= kMaxJoined)
          joined.back().second = std::max(end, joined.back().second);
        else
          joined.emplace_back(begin, end);
      }
    }
  }

  void prefetch_zip_ends(const ItemMeta& item, const DcpMetadata& md) {
    std::vector<Shape> chunks;
    for (const ChunkMeta& cm : item.chunks) chunks.push_back(cm.offsets);
    if (!item.is_tensor) chunks.push_back({});
    for (const Shape& offsets : chunks) {
      auto it = md.storage.find({item.fqn, offsets});
      if (it == md.storage.end() || unreadable_.count(it->second.relative_path)) continue;
      const StorageInfo& info = it->second;
      auto ranges = header_ranges_.find(info.relative_path);
      if (!info.transforms.empty() || info.length > UINT64_MAX - info.offset || ranges == header_ranges_.end())
        continue;  // read whole (decompressed) or refused when read
      try {
        check_relative_path(info.relative_path);
        SourcePtr file = open(info.relative_path);
        for (uint64_t at : {info.offset, info.offset + info.length - std::min(info.length, kZipTail)}) {
          // The joined range holding `at`: the last that begins at or before it.
          auto r = std::upper_bound(ranges->second.begin(), ranges->second.end(), std::make_pair(at, UINT64_MAX));
          if (r != ranges->second.begin()) --r;
          file->prefetch(r->first, r->second - r->first);
        }
      } catch (const Error&) {
        // Only a hint: reading the item reports what is wrong with it.
      }
    }
  }

  ValuePtr read_tensor(const ItemMeta& item, const DcpMetadata& md, CheckpointModel& model) {
    TensorEntry t;
    t.name = item.fqn;
    t.dtype = item.dtype;
    t.shape = item.size;
    bool all_read = true;
    for (const ChunkMeta& cm : item.chunks) {
      // With a sink, every chunk that cannot be read is reported (naming its
      // file and rank); the tensor is then left out.
      Place place{chunk_file(item.fqn, cm.offsets, md), chunk_rank(item.fqn, cm.offsets, md), item.fqn};
      all_read &= run_reporting(sink_, place.file, place.rank, item.fqn, [&] {
        with_place(place, [&] {
          with_context("key '" + item.fqn + "'", [&] {
            int rank = -1;
            uint64_t chunk_bytes = checked_mul(shape_numel(cm.sizes), dtype_size(item.dtype));
            SourcePtr src = item_source(item.fqn, cm.offsets, md, &rank, checked_add(chunk_bytes, kTensorItemOverhead));
            std::vector<TensorEntry> local;
            ValuePtr shard = with_context(src->describe(),
                                          [&] { return torch_pt::decode_archive(src, local, item.fqn, rank, sink_); });
            auto idx = tensor_ref_index(*shard);
            if (!idx || local.size() != 1)
              fail_data_loss(src->describe() + ": tensor item does not hold exactly one tensor");
            TensorEntry& piece = local[*idx];
            if (piece.dtype != item.dtype)
              fail_data_loss(src->describe() + ": chunk dtype " + std::string(dtype_name(piece.dtype)) +
                             " differs from metadata " + std::string(dtype_name(item.dtype)));
            if (piece.shape != cm.sizes)
              fail_data_loss(src->describe() + ": chunk shape " + shape_str(piece.shape) + " differs from metadata " +
                             shape_str(cm.sizes));
            TensorChunk chunk = std::move(piece.chunks.at(0));
            chunk.offsets = cm.offsets;
            t.chunks.push_back(std::move(chunk));
          });
        });
      });
    }
    if (!all_read) return nullptr;
    model.tensors.push_back(std::move(t));
    return make_tensor_ref(model.tensors.size() - 1);
  }

  ValuePtr read_bytes(const ItemMeta& item, const DcpMetadata& md, CheckpointModel& model) {
    ValuePtr value;
    run_reporting(sink_, chunk_file(item.fqn, {}, md), chunk_rank(item.fqn, {}, md), item.fqn, [&] {
      with_context("key '" + item.fqn + "'", [&] {
        int rank = -1;
        SourcePtr src = item_source(item.fqn, {}, md, &rank, kMaxBytesItem);
        value = with_context(src->describe(), [&] {
          return torch_pt::decode_archive(src, model.tensors, item.fqn, rank, sink_, bytes_policy_);
        });
      });
    });
    return value;
  }

  // Where a chunk's item lives, for problems ("" / -1 when the metadata does not say).
  std::string chunk_file(const std::string& fqn, const Shape& offsets, const DcpMetadata& md) const {
    auto it = md.storage.find({fqn, offsets});
    return it == md.storage.end() ? "" : (fs::path(dir_) / it->second.relative_path).string();
  }
  static int chunk_rank(const std::string& fqn, const Shape& offsets, const DcpMetadata& md) {
    auto it = md.storage.find({fqn, offsets});
    return it == md.storage.end() ? -1 : rank_of_file(fs::path(it->second.relative_path).filename().string());
  }

  SourcePtr open(const std::string& relative) {
    auto& slot = files_[relative];
    if (!slot) {
      std::string path = (fs::path(dir_) / relative).string();
      require_inside(path, dir_);
      slot = open_mapped_source(path);
    }
    return slot;
  }

  std::string dir_;
  ProblemSink* sink_;
  const pickle::GlobalPolicy& bytes_policy_;
  std::map<std::string, SourcePtr> files_;
  std::set<std::string> unreadable_;  // relative paths reported by check_storage_files
  // Per file, the sorted ranges holding its items' zip headers (plan_header_ranges).
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> header_ranges_;
  int metadata_files_ = 0;
};

}  // namespace

CheckpointModel read_dcp_dir(const std::string& dir, ProblemSink* sink, const pickle::GlobalPolicy& bytes_policy) {
  return DcpDirReader(dir, sink, bytes_policy).read();
}

namespace {

// The entry `key` of a DCP directory's top level (Accelerate saves
// {"model": ...} and {"optimizer": ...}), or the whole tree when it has no such key.
ValuePtr entry_or_root(const ValuePtr& root, const std::string& key) {
  ValuePtr dict = mapping_of(root);
  if (dict->is(Kind::kDict) && dict->entries.size() == 1 && path_component(*dict->entries[0].first) == key)
    return dict->entries[0].second;
  return root;
}

}  // namespace

CheckpointModel read_dcp_pair(const std::string& dir, ProblemSink* sink) {
  static const LinearRegex kPart = LinearRegex::compile(R"((pytorch_model_fsdp|optimizer)_(\d+))");
  std::vector<std::pair<std::string, fs::path>> parts;  // output key, directory
  for (const DirEntry& e : list_directory(dir)) {
    RegexMatch m;
    const std::string& name = e.name;
    if (!e.is_directory() || !kPart.match(name, m)) continue;
    bool model = m[1] == "pytorch_model_fsdp";
    std::string index = m.str(2);
    parts.emplace_back(std::string(model ? "model" : "optim") + (index == "0" ? "" : "_" + index), fs::path(e.path));
  }
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::stable_partition(parts.begin(), parts.end(), [](const auto& p) { return p.first.rfind("model", 0) == 0; });
  CheckpointModel model;
  model.source = dir;
  model.info.kind = SourceKind::kDcpPair;
  auto root = Value::dict();
  for (auto& [key, path] : parts) {
    CheckpointModel part = read_dcp_dir(path.string(), sink);
    for (int ws : part.info.world_sizes)
      if (std::find(model.info.world_sizes.begin(), model.info.world_sizes.end(), ws) == model.info.world_sizes.end())
        model.info.world_sizes.push_back(ws);
    model.info.files.insert(model.info.files.end(), part.info.files.begin(), part.info.files.end());
    for (const auto& [fact, value] : part.facts) model.facts[path.filename().string() + " " + fact] = value;
    // Tensor names are paths: under the output key now.
    std::string inner = key.rfind("model", 0) == 0 ? "model" : "optimizer";
    for (auto& t : part.tensors)
      if (t.name.rfind(inner + ".", 0) == 0) t.name = key + t.name.substr(inner.size());
    part.root = entry_or_root(part.root, inner);
    root->entries.emplace_back(Value::str(key), adopt(model, std::move(part)));
  }
  if (root->entries.empty()) fail(ErrorCode::kNotFound, dir + ": no pytorch_model_fsdp_<i>/ or optimizer_<i>/ inside");
  model.root = root;
  return model;
}

}  // namespace ckpt::dcp
