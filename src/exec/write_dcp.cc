#include "exec/write_dcp.h"

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "core/error.h"
#include "core/paths.h"
#include "formats/dcp/dcp_writer.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"
#include "io/byte_source.h"
#include "io/counting_sink.h"
#include "model/tree_walk.h"
#include "pickle/framework_objects.h"

namespace ckpt {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

}  // namespace

namespace {

bool contains_tensor(const Value& v) {
  if (tensor_ref_index(v)) return true;
  for (const auto& item : v.items)
    if (contains_tensor(*item)) return true;
  for (const auto& [k, value] : v.entries)
    if (contains_tensor(*value)) return true;
  return false;
}

// _traverse.traverse_state_dict's _is_terminal with _keep_visiting_tensors.
bool is_terminal(const Value& v) {
  if (v.is(Kind::kDict) || (v.is(Kind::kBuilt) && v.object && v.object->is(Kind::kDict))) return false;
  if (!v.is(Kind::kList)) return true;
  for (const auto& entry : v.items) {
    if ((entry->is(Kind::kDict) || entry->is(Kind::kList)) && !is_terminal(*entry)) return false;
    if (tensor_ref_index(*entry)) return false;
  }
  return true;
}

void flatten(const CheckpointModel& model, const ValuePtr& value, std::vector<ValuePtr>& path, dcp::DcpMetadata& out) {
  ValuePtr v = mapping_of(value);
  if (v->is(Kind::kDict)) {
    for (const auto& [k, child] : v->entries) {
      path.push_back(Value::str(path_component(*k)));
      flatten(model, child, path, out);
      path.pop_back();
    }
    return;
  }
  if (!is_terminal(*v)) {
    for (std::size_t i = 0; i < v->items.size(); ++i) {
      path.push_back(Value::integer(static_cast<int64_t>(i)));
      flatten(model, v->items[i], path, out);
      path.pop_back();
    }
    return;
  }
  std::string key;
  for (const auto& element : path) {
    if (!key.empty()) key += '.';
    key += element->is(Kind::kStr) ? element->text : std::to_string(element->int_value);
  }
  dcp::ItemMeta item;
  item.fqn = key;
  if (auto idx = tensor_ref_index(*v)) {
    const TensorEntry& t = model.tensors.at(*idx);
    item.is_tensor = true;
    item.dtype = t.output_dtype();
    item.size = t.shape;
  } else if (contains_tensor(*v)) {
    fail(ErrorCode::kUnimplemented, model.source + ": '" + key +
                                        "' holds tensors inside a tuple; dcp.save would pickle them "
                                        "as one bytes item, which reshard does not write (--layout fsdp-* keeps them)");
  }
  out.items.push_back(std::move(item));
  out.planner_data[key] = path;
  out.planner_order.push_back(key);
}

}  // namespace

dcp::DcpMetadata flattened_layout(const CheckpointModel& model) {
  require_state_dict(model, "a DCP checkpoint");
  dcp::DcpMetadata out;
  std::vector<ValuePtr> path;
  flatten(model, model.root, path, out);
  return out;
}

namespace {

using EntryOf = std::function<const TensorEntry&(std::size_t)>;
// Appends one item (a torch.save archive of `root`) to rank `rank`'s file.
using AppendItem = std::function<dcp::StorageInfo(
    int rank, const Value& root, const std::vector<torch_pt::OutputTensor>& tensors, const EntryOf& entry_of)>;

// Walks the source items in order, appending each output item through
// `append`; returns the output metadata.
dcp::DcpMetadata emit_items(const CheckpointModel& model, const dcp::DcpMetadata& source, const ReshardPlan& plan,
                            const AppendItem& append) {
  std::map<std::string, std::size_t> tensor_of;
  for (std::size_t i = 0; i < model.tensors.size(); ++i) tensor_of.emplace(model.tensors[i].name, i);
  std::vector<torch_pt::OutputTensor> all_tensors;
  for (const auto& t : model.tensors) all_tensors.push_back({t.output_dtype(), t.shape, false, false});
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
        out.storage[{item.fqn, {}}] = append(0, *pickle::with_stored_objects(value), all_tensors, model_entry);
        out.items.push_back(std::move(item));
        return;
      }
      std::optional<std::size_t> index;
      if (auto pd = source.planner_data.find(src_item.fqn); pd != source.planner_data.end())
        index = tensor_ref_index(*value_at_path(model.root, pd->second, src_item.fqn));
      if (auto it = tensor_of.find(src_item.fqn); !index && it != tensor_of.end()) index = it->second;
      if (!index) fail(ErrorCode::kInternal, "tensor item missing from the model");
      const TensorEntry& t = model.tensors[*index];
      item.dtype = t.output_dtype();
      item.size = t.shape;
      ValuePtr root = make_tensor_ref(0);
      for (const auto& [rank, item_index] : plan.items_of_tensor.at(*index)) {
        const OutputItem& oi = plan.ranks.at(static_cast<std::size_t>(rank)).at(item_index);
        TensorEntry local = item_tensor(t, oi);
        std::vector<torch_pt::OutputTensor> one = {{t.output_dtype(), oi.sizes, false, false}};
        out.storage[{item.fqn, oi.offsets}] =
            append(rank, *root, one, [&](std::size_t) -> const TensorEntry& { return local; });
        item.chunks.push_back({oi.offsets, oi.sizes});
      }
      out.items.push_back(std::move(item));
    });
  }
  return out;
}

// Each side file as a file of `into`.
void write_side_files(const std::vector<SideFile>& side_files, const std::string& into, bool durable) {
  for (const SideFile& file : side_files) {
    auto sink = AtomicFileSink::create(path_join(into, file.name), false, durable);
    sink->write(file.bytes);
    sink->finish();
  }
}

}  // namespace

// Through a file source, as every input is read: a side file linked out of
// the checkpoint is refused like any other (io/containment.h).
void copy_side_files(const std::vector<std::string>& side_files, const std::string& into) {
  for (const auto& file : side_files) {
    const std::string to = path_join(into, file_name(file));
    SourcePtr from = open_file_source(file);
    auto sink = AtomicFileSink::create(to, false, false);
    sink->copy_from(*from, 0, from->size());
    sink->finish();
  }
}

DcpWriter::DcpWriter(const CheckpointModel& model, const dcp::DcpMetadata& source, const ReshardPlan& plan,
                     std::string dir, std::vector<SideFile> side_files)
    : model_(model),
      source_(source),
      plan_(plan),
      dir_(without_trailing_slashes(std::move(dir))),
      side_files_(std::move(side_files)) {
  require_distinct_paths(*model.root, "a DCP checkpoint");
}

std::vector<std::string> DcpWriter::file_names() const {
  std::vector<std::string> names;
  for (int r = 0; r < plan_.world_size; ++r) names.push_back(dcp::rank_file_name(r));
  return names;
}

std::string DcpWriter::output_path(std::size_t k) const {
  return dir_ + "/" + dcp::rank_file_name(static_cast<int>(k));
}

void DcpWriter::run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) {
  metadata_ = emit_items(
      model_, source_, plan_,
      [&](int rank, const Value& root, const std::vector<torch_pt::OutputTensor>& tensors, const EntryOf& entry_of) {
        ByteSink& sink = *sinks.at(static_cast<std::size_t>(rank));
        return dcp::append_item_to(sink, rank, root, tensors, [&](std::size_t i, archive::ZipWriter& zip) {
          const TensorEntry& t = entry_of(i);
          emit({static_cast<std::size_t>(rank), t.output_nbytes(), &t, {}}, sink, &zip);
        });
      });
}

Published DcpWriter::publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) {
  return publish_directory(dir_, file_names(), data_path, force, durable, [&](const std::string& temp) {
    write_side_files(side_files_, temp, durable);
    auto meta = AtomicFileSink::create(temp + "/.metadata", false, durable);
    meta->write(dcp::encode_metadata(metadata_, dir_, dcp::random_save_id()));
    meta->finish();
  });
}

std::vector<MarkerFile> DcpWriter::marker_files() const {
  std::vector<MarkerFile> out;
  for (const SideFile& file : side_files_) out.push_back({path_join(dir_, file.name), file.bytes});
  out.push_back({dir_ + "/.metadata", dcp::encode_metadata(metadata_, dir_, dcp::random_save_id())});
  return out;
}

uint64_t DcpWriter::metadata_size() const { return dcp::encode_metadata(metadata_, dir_, std::string(36, '0')).size(); }

}  // namespace ckpt
