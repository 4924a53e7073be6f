#include "exec/write_dcp.h"

#include <cstring>
#include <functional>
#include <map>

#include "core/error.h"
#include "formats/dcp/dcp_writer.h"

namespace ckpt {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// The item's tensor as append_tensor sees it: shape = the item's box, each
// piece a view of its source chunk re-based to the box's origin.
TensorEntry item_tensor(const TensorEntry& t, const OutputItem& item) {
  TensorEntry local;
  local.name = t.name;
  local.dtype = t.dtype;
  local.shape = item.sizes;
  for (const SourcePiece& piece : item.pieces) {
    TensorChunk c = t.chunks.at(piece.chunk);
    int64_t storage_offset = c.storage_offset;
    for (std::size_t d = 0; d < piece.offsets.size(); ++d) storage_offset += (piece.offsets[d] - c.offsets[d]) * c.strides[d];
    Shape offsets(piece.offsets.size());
    for (std::size_t d = 0; d < offsets.size(); ++d) offsets[d] = piece.offsets[d] - item.offsets[d];
    c.storage_offset = storage_offset;
    c.offsets = std::move(offsets);
    c.sizes = piece.sizes;
    local.chunks.push_back(std::move(c));
  }
  return local;
}

}  // namespace

ValuePtr value_at_path(const ValuePtr& root, const std::vector<ValuePtr>& path, const std::string& key) {
  ValuePtr cur = root;
  for (const ValuePtr& element : path) {
    ValuePtr next;
    if (cur->is(Kind::kDict) && element->is(Kind::kStr)) {
      for (const auto& [k, v] : cur->entries)
        if (k->is(Kind::kStr) && k->text == element->text) next = v;
    } else if (cur->is(Kind::kList) && element->is(Kind::kInt) && element->int_value >= 0 &&
               static_cast<std::size_t>(element->int_value) < cur->items.size()) {
      next = cur->items[static_cast<std::size_t>(element->int_value)];
    }
    if (!next) fail_data_loss("key '" + key + "': its planner_data path leads nowhere in the state dict");
    cur = next;
  }
  return cur;
}

namespace {

using EntryOf = std::function<const TensorEntry&(std::size_t)>;
// Appends one item (a torch.save archive of `root`) to rank `rank`'s file.
using AppendItem = std::function<dcp::StorageInfo(int rank, const Value& root, const std::vector<torch_pt::OutputTensor>& tensors,
                                                  const EntryOf& entry_of)>;

// Walks the source items in order, appending each output item through
// `append`; returns the output metadata.
dcp::DcpMetadata emit_items(const CheckpointModel& model, const dcp::DcpMetadata& source, const ReshardPlan& plan,
                            const AppendItem& append) {
  std::map<std::string, std::size_t> tensor_of;
  for (std::size_t i = 0; i < model.tensors.size(); ++i) tensor_of.emplace(model.tensors[i].name, i);
  std::vector<torch_pt::OutputTensor> all_tensors;
  for (const auto& t : model.tensors) all_tensors.push_back({t.dtype, t.shape, false, false});
  EntryOf model_entry = [&](std::size_t i) -> const TensorEntry& { return model.tensors.at(i); };

  dcp::DcpMetadata out;
  out.planner_data = source.planner_data;
  out.planner_order = source.planner_order;
  out.has_storage_meta = true;
  out.version = "1.0.0";
  for (const dcp::ItemMeta& src_item : source.items) {
    with_context("key '" + src_item.fqn + "'", [&] {
      dcp::ItemMeta item;
      item.fqn = src_item.fqn;
      item.is_tensor = src_item.is_tensor;
      if (!src_item.is_tensor) {
        auto pd = source.planner_data.find(src_item.fqn);
        ValuePtr value = pd != source.planner_data.end()
                             ? value_at_path(model.root, pd->second, src_item.fqn)
                             : value_at_path(model.root, {Value::str(src_item.fqn)}, src_item.fqn);
        out.storage[{item.fqn, {}}] = append(0, *value, all_tensors, model_entry);
        out.items.push_back(std::move(item));
        return;
      }
      auto it = tensor_of.find(src_item.fqn);
      if (it == tensor_of.end()) fail(ErrorCode::kInternal, "tensor item missing from the model");
      const TensorEntry& t = model.tensors[it->second];
      item.dtype = t.dtype;
      item.size = t.shape;
      ValuePtr root = make_tensor_ref(0);
      for (const auto& [rank, index] : plan.items_of_tensor.at(it->second)) {
        const OutputItem& oi = plan.ranks.at(static_cast<std::size_t>(rank)).at(index);
        TensorEntry local = item_tensor(t, oi);
        std::vector<torch_pt::OutputTensor> one = {{t.dtype, oi.sizes, false, false}};
        out.storage[{item.fqn, oi.offsets}] = append(rank, *root, one, [&](std::size_t) -> const TensorEntry& { return local; });
        item.chunks.push_back({oi.offsets, oi.sizes});
      }
      out.items.push_back(std::move(item));
    });
  }
  return out;
}

// Counts what would be written; copies from sources cost nothing.
class CountingSink final : public ByteSink {
 public:
  using ByteSink::write;
  void write(const void*, std::size_t n) override { position_ += n; }
  uint64_t position() const override { return position_; }
  void copy_from(const ByteSource&, uint64_t, uint64_t n) override { position_ += n; }

 private:
  uint64_t position_ = 0;
};

// n zero bytes, never materialised (CountingSink does not read them).
class ZeroSource final : public ByteSource {
 public:
  explicit ZeroSource(uint64_t n) : n_(n) {}
  uint64_t size() const override { return n_; }
  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    std::memset(buf, 0, n);
  }
  std::string describe() const override { return "<zeros>"; }

 private:
  uint64_t n_;
};

}  // namespace

DcpOutputSizes dcp_output_sizes(const CheckpointModel& model, const dcp::DcpMetadata& source, const ReshardPlan& plan,
                                const std::string& dir) {
  std::vector<CountingSink> sinks(static_cast<std::size_t>(plan.world_size));
  dcp::DcpMetadata out = emit_items(model, source, plan, [&](int rank, const Value& root, const std::vector<torch_pt::OutputTensor>& tensors,
                                                          const EntryOf&) {
    CountingSink& sink = sinks.at(static_cast<std::size_t>(rank));
    dcp::StorageInfo info;
    info.relative_path = dcp::DcpDirWriter::file_name(rank);
    info.offset = sink.position();
    torch_pt::write_pt(sink, root, tensors, [&](std::size_t i, archive::ZipWriter& zip) {
      uint64_t n = shape_numel(tensors[i].shape) * dtype_size(tensors[i].dtype);
      zip.append_from(ZeroSource(n), 0, n, 0u);
    });
    info.length = sink.position() - info.offset;
    return info;
  });
  DcpOutputSizes sizes;
  for (const auto& s : sinks) sizes.files.push_back(s.position());
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  sizes.metadata = dcp::encode_metadata(out, trimmed, std::string(36, '0')).size();
  return sizes;
}

void write_dcp_reshard(const CheckpointModel& model, const dcp::DcpMetadata& source, const ReshardPlan& plan,
                       const DcpOutputOptions& options) {
  dcp::DcpDirWriter writer(options.dir, plan.world_size, options.force);
  dcp::DcpMetadata out = emit_items(model, source, plan, [&](int rank, const Value& root, const std::vector<torch_pt::OutputTensor>& tensors,
                                                          const EntryOf& entry_of) {
    return writer.append_item(rank, root, tensors, [&](std::size_t i, archive::ZipWriter& zip) {
      append_tensor(entry_of(i), zip, options.copy);
    });
  });
  writer.finish(out);
}

}  // namespace ckpt
