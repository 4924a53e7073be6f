#include "formats/dcp/dcp_metadata.h"

#include <algorithm>

#include "core/error.h"
#include "formats/pyobj.h"

namespace ckpt::dcp {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

DType properties_dtype(const Value& props) {
  ValuePtr state = pyobj::state_of(props);
  if (!state) fail_data_loss("TensorProperties has no state");
  if (state->is(Kind::kTuple) && !state->items.empty()) return pyobj::torch_dtype(*state->items[0]);
  if (state->is(Kind::kDict)) return pyobj::torch_dtype(*state->at("dtype"));
  fail_data_loss("TensorProperties state is neither a tuple nor a dict");
}

ItemMeta parse_item(const std::string& fqn, const Value& v) {
  ItemMeta item;
  item.fqn = fqn;
  if (pyobj::is_class(v, "BytesStorageMetadata")) return item;
  if (!pyobj::is_class(v, "TensorStorageMetadata"))
    fail_data_loss("unexpected metadata class '" + pyobj::class_name(v) + "'");
  item.is_tensor = true;
  item.dtype = properties_dtype(*pyobj::require_field(v, "properties"));
  item.size = pyobj::int_sequence(*pyobj::require_field(v, "size"), "tensor size");
  for (const auto& chunk : pyobj::require_field(v, "chunks")->as_sequence()) {
    ChunkMeta c;
    c.offsets = pyobj::int_sequence(*pyobj::require_field(*chunk, "offsets"), "chunk offsets");
    c.sizes = pyobj::int_sequence(*pyobj::require_field(*chunk, "sizes"), "chunk sizes");
    item.chunks.push_back(std::move(c));
  }
  return item;
}

StorageInfo parse_storage_info(const Value& v) {
  StorageInfo info;
  info.relative_path = pyobj::require_field(v, "relative_path")->as_str();
  int64_t offset = pyobj::require_field(v, "offset")->as_int();
  int64_t length = pyobj::require_field(v, "length")->as_int();
  if (offset < 0 || length < 0) fail_data_loss("negative storage offset or length");
  info.offset = static_cast<uint64_t>(offset);
  info.length = static_cast<uint64_t>(length);
  if (ValuePtr t = pyobj::field(v, "transform_descriptors"); t && !t->is(Kind::kNone))
    for (const auto& d : t->as_sequence()) info.transforms.push_back(d->as_str());
  return info;
}

}  // namespace

namespace {
// The unpickler's own nesting limit (UnpickleLimits::max_depth).
constexpr std::size_t kMaxPlannerPath = 512;
}  // namespace

DcpMetadata parse_metadata(const Value& root) {
  if (!pyobj::is_class(root, "Metadata"))
    fail_data_loss("not a DCP Metadata object (class '" + pyobj::class_name(root) + "')");
  DcpMetadata md;
  // Entries are taken by pair, not structured bindings: clang 14 (fuzz
  // builds) cannot capture those in lambdas.
  for (const auto& entry : pyobj::require_field(root, "state_dict_metadata")->entries) {
    const std::string& fqn = entry.first->as_str();
    const Value& value = *entry.second;
    md.items.push_back(with_context("key '" + fqn + "'", [&] { return parse_item(fqn, value); }));
  }
  if (ValuePtr pd = pyobj::field(root, "planner_data"); pd && pd->is(Kind::kDict)) {
    for (const auto& [key, value] : pd->entries) {
      if (!key->is(Kind::kStr) || !(value->is(Kind::kTuple) || value->is(Kind::kList))) continue;
      // Each element is one level of the rebuilt state dict, which later
      // walks descend: bounded like any other nesting a file can ask for.
      if (value->items.size() > kMaxPlannerPath) {
        fail(ErrorCode::kUnsafe, "key '" + key->text + "': its planner_data path has " +
                                     std::to_string(value->items.size()) + " elements; a state dict nested more than " +
                                     std::to_string(kMaxPlannerPath) + " levels deep is not one ckptconv reads");
      }
      if (md.planner_data.emplace(key->text, value->items).second) md.planner_order.push_back(key->text);
    }
  }
  for (const auto& entry : pyobj::require_field(root, "storage_data")->entries) {
    const Value& key = *entry.first;
    const Value& value = *entry.second;
    const std::string& fqn = pyobj::require_field(key, "fqn")->as_str();
    with_context("storage of key '" + fqn + "'", [&] {
      ValuePtr off = pyobj::field(key, "offset");
      Shape offsets = (off && !off->is(Kind::kNone)) ? pyobj::int_sequence(*off, "storage index offset") : Shape{};
      md.storage[{fqn, offsets}] = parse_storage_info(value);
    });
  }
  if (ValuePtr sm = pyobj::field(root, "storage_meta"); sm && !sm->is(Kind::kNone)) md.has_storage_meta = true;
  if (ValuePtr v = pyobj::field(root, "version"); v && v->is(Kind::kStr)) md.version = v->text;
  // torch writes "1.0.0" (_version._derived_version); another major version
  // is a layout this reader does not know.
  if (!md.version.empty() && md.version.substr(0, md.version.find('.')) != "1")
    fail(ErrorCode::kUnimplemented, "DCP metadata version '" + md.version + "' is not one this reader knows (1.x)");
  return md;
}

namespace {
std::string describe_item(const ItemMeta& item) {
  return item.is_tensor ? std::string(dtype_name(item.dtype)) + " " + shape_str(item.size) : "bytes";
}
}  // namespace

DcpMetadata merge_rank_metadata(std::vector<DcpMetadata> ranks, ProblemSink* sink) {
  if (ranks.empty()) fail_data_loss("no metadata to merge");
  DcpMetadata out = std::move(ranks[0]);
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < out.items.size(); ++i) index[out.items[i].fqn] = i;
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    for (ItemMeta& item : ranks[r].items) {
      auto it = index.find(item.fqn);
      if (it == index.end()) {
        index[item.fqn] = out.items.size();
        out.items.push_back(std::move(item));
        continue;
      }
      ItemMeta& have = out.items[it->second];
      if (have.is_tensor != item.is_tensor || have.dtype != item.dtype || have.size != item.size) {
        report_or_fail(sink, {ErrorCode::kDataLoss,
                              "key '" + item.fqn + "': rank metadata files disagree about its type, dtype or size (" +
                                  describe_item(have) + " in the first, " + describe_item(item) + " in __" +
                                  std::to_string(r) + ".metadata)",
                              "__" + std::to_string(r) + ".metadata", static_cast<int>(r), item.fqn});
        continue;
      }
      for (ChunkMeta& c : item.chunks) {
        bool seen = std::any_of(have.chunks.begin(), have.chunks.end(),
                                [&](const ChunkMeta& h) { return h.offsets == c.offsets && h.sizes == c.sizes; });
        if (!seen) have.chunks.push_back(std::move(c));  // replicated chunks are written by every rank
      }
    }
    for (const auto& key : ranks[r].planner_order)
      if (out.planner_data.emplace(key, ranks[r].planner_data[key]).second) out.planner_order.push_back(key);
    out.storage.merge(ranks[r].storage);
    out.has_storage_meta = out.has_storage_meta || ranks[r].has_storage_meta;
  }
  // Each rank lists its own items first (replicated ones only where the
  // planner put them); planner_data holds every key in the order of the
  // state dict each rank saved, which is the order a consolidated dict keeps.
  std::map<std::string, std::size_t> rank_of_key;
  for (std::size_t i = 0; i < out.planner_order.size(); ++i) rank_of_key.emplace(out.planner_order[i], i);
  std::stable_sort(out.items.begin(), out.items.end(), [&](const ItemMeta& a, const ItemMeta& b) {
    auto ia = rank_of_key.find(a.fqn), ib = rank_of_key.find(b.fqn);
    std::size_t pa = ia == rank_of_key.end() ? SIZE_MAX : ia->second,
                pb = ib == rank_of_key.end() ? SIZE_MAX : ib->second;
    return pa < pb;
  });
  return out;
}

FlatLayout flat_layout_of(const DcpMetadata& md) {
  FlatLayout out;
  for (const auto& item : md.items) out.items.emplace_back(item.fqn, item.is_tensor);
  out.planner_data = md.planner_data;
  out.planner_order = md.planner_order;
  return out;
}

DcpMetadata metadata_of(const FlatLayout& layout) {
  DcpMetadata md;
  for (const auto& [fqn, is_tensor] : layout.items) {
    ItemMeta item;
    item.fqn = fqn;
    item.is_tensor = is_tensor;
    md.items.push_back(std::move(item));
  }
  md.planner_data = layout.planner_data;
  md.planner_order = layout.planner_order;
  return md;
}

}  // namespace ckpt::dcp
