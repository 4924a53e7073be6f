#include "exec/write_dcp.h"

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

void write_dcp_reshard(const CheckpointModel& model, const dcp::DcpMetadata& source, const ReshardPlan& plan,
                       const DcpOutputOptions& options) {
  std::map<std::string, std::size_t> tensor_of;
  for (std::size_t i = 0; i < model.tensors.size(); ++i) tensor_of.emplace(model.tensors[i].name, i);
  std::vector<torch_pt::OutputTensor> all_tensors;
  for (const auto& t : model.tensors) all_tensors.push_back({t.dtype, t.shape, false, false});

  dcp::DcpDirWriter writer(options.dir, plan.world_size, options.force);
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
        out.storage[{item.fqn, {}}] = writer.append_item(0, *value, all_tensors, [&](std::size_t index, archive::ZipWriter& zip) {
          append_tensor(model.tensors.at(index), zip, options.copy);
        });
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
        out.storage[{item.fqn, oi.offsets}] = writer.append_item(rank, *root, one, [&](std::size_t, archive::ZipWriter& zip) {
          append_tensor(local, zip, options.copy);
        });
        item.chunks.push_back({oi.offsets, oi.sizes});
      }
      out.items.push_back(std::move(item));
    });
  }
  writer.finish(out);
}

}  // namespace ckpt
