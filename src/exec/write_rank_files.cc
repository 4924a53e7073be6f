#include "exec/write_rank_files.h"

#include <functional>
#include <memory>
#include <unordered_map>

#include "core/error.h"
#include "formats/torch_pt/pt_writer.h"
#include "formats/torch_pt/sharded_values.h"
#include "io/atomic_dir.h"
#include "io/counting_sink.h"

namespace ckpt {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// One output file: its tree (tensor references index `tensors`) and where
// each stored tensor's bytes come from.
struct RankFileContent {
  ValuePtr root;
  std::vector<torch_pt::OutputTensor> tensors;
  std::vector<TensorEntry> sources;       // per tensor: its piece of the model's tensor
  std::optional<std::size_t> mesh_index;  // the DeviceMesh's rank map, filled from `mesh_bytes`
  std::string mesh_bytes;
};

// Rebuilds a family's state dict for one rank: tensor references become
// that rank's ShardedTensor/DTensor values (or whole tensors), containers
// are copied with their sharing kept, everything else is shared as is.
class RankFileBuilder {
 public:
  RankFileBuilder(const CheckpointModel& model, const ReshardPlan& plan, const RankFilesLayout& layout, int rank)
      : model_(model), plan_(plan), layout_(layout), rank_(rank) {}

  RankFileContent build(const ValuePtr& root) {
    content_.root = rebuild(root);
    return std::move(content_);
  }

 private:
  ValuePtr rebuild(const ValuePtr& v) {
    if (!v) return v;
    if (auto it = done_.find(v.get()); it != done_.end()) return it->second;
    ValuePtr out;
    if (auto idx = tensor_ref_index(*v)) {
      out = tensor_value(*idx);
    } else if (v->items.empty() && v->entries.empty() && !v->args && !v->state && !v->object && !v->pid) {
      out = v;  // a leaf: nothing inside can change
    } else {
      out = std::make_shared<Value>(*v);
      done_[v.get()] = out;  // a container reached again stays one object
      for (auto& item : out->items) item = rebuild(item);
      for (auto& [key, value] : out->entries) value = rebuild(value);
      out->args = rebuild(out->args);
      out->state = rebuild(out->state);
      out->object = rebuild(out->object);
    }
    done_[v.get()] = out;
    return out;
  }

  std::size_t add_tensor(DType dtype, const Shape& shape, TensorEntry source) {
    content_.tensors.push_back({dtype, shape, false, false});
    content_.sources.push_back(std::move(source));
    return content_.tensors.size() - 1;
  }

  ValuePtr tensor_value(std::size_t index) {
    const TensorEntry& t = model_.tensors.at(index);
    const auto& [rank, item_index] = plan_.items_of_tensor.at(index).at(static_cast<std::size_t>(rank_));
    if (rank != rank_) fail(ErrorCode::kInternal, "per-rank plan out of order for " + t.name);
    const OutputItem& item = plan_.ranks.at(static_cast<std::size_t>(rank)).at(item_index);
    ValuePtr local = make_tensor_ref(add_tensor(t.output_dtype(), item.sizes, item_tensor(t, item)));
    if (plan_.replicated.at(index)) return local;
    if (layout_.values == RankLayout::kShardedTensor)
      return torch_pt::make_sharded_tensor(t.output_dtype(), t.shape, rank_, plan_.world_size, local);
    return torch_pt::make_dtensor(t.output_dtype(), t.shape, mesh(), local);
  }

  // One DeviceMesh per file, shared by its DTensors as torch pickles it.
  ValuePtr mesh() {
    if (mesh_) return mesh_;
    int n = plan_.world_size;
    content_.mesh_index = add_tensor(DType::kInt32, {n}, TensorEntry{});
    for (int32_t r = 0; r < n; ++r)
      for (int b = 0; b < 4; ++b)
        content_.mesh_bytes += static_cast<char>((static_cast<uint32_t>(r) >> (8 * b)) & 0xff);
    mesh_ = torch_pt::make_device_mesh(rank_, n, make_tensor_ref(*content_.mesh_index), layout_.mesh);
    return mesh_;
  }

  const CheckpointModel& model_;
  const ReshardPlan& plan_;
  const RankFilesLayout& layout_;
  int rank_;
  RankFileContent content_;
  std::unordered_map<const Value*, ValuePtr> done_;
  ValuePtr mesh_;
};

using WriteFile = std::function<void(int rank, const std::string& name, const RankFileContent& content)>;

std::string output_file_name(const RankFamily& family, int rank, int world_size) {
  fsdp_ranks::RankFileName name = family.name;
  name.world_size = world_size;
  return name.name_for(rank);
}

// Every output file, rank by rank, family by family.
void emit_rank_files(const CheckpointModel& model, const std::vector<RankFamily>& families,
                     const RankFilesLayout& layout, const ReshardPlan& plan, const WriteFile& write) {
  for (int r = 0; r < plan.world_size; ++r) {
    for (const RankFamily& family : families) {
      std::string file = output_file_name(family, r, plan.world_size);
      with_context(file + " (rank " + std::to_string(r) + ")", [&] {
        RankFileContent content = RankFileBuilder(model, plan, layout, r).build(family.root);
        write(r, file, content);
      });
    }
  }
}

}  // namespace

RankFilesWriter::RankFilesWriter(const CheckpointModel& model, const std::vector<RankFamily>& families,
                                 const RankFilesLayout& layout, const ReshardPlan& plan, std::string dir)
    : model_(model), families_(families), layout_(layout), plan_(plan), dir_(without_trailing_slashes(std::move(dir))) {
  for (int r = 0; r < plan_.world_size; ++r)
    for (const RankFamily& family : families_) names_.push_back(output_file_name(family, r, plan_.world_size));
}

std::string RankFilesWriter::kind() const { return rank_layout_name(layout_.values); }

void RankFilesWriter::run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) {
  std::size_t k = 0;
  emit_rank_files(model_, families_, layout_, plan_, [&](int, const std::string&, const RankFileContent& content) {
    const std::size_t file = k++;
    ByteSink& sink = *sinks.at(file);
    torch_pt::write_pt(sink, *content.root, content.tensors, [&](std::size_t i, archive::ZipWriter& zip) {
      if (content.mesh_index == i)
        emit({file, content.mesh_bytes.size(), nullptr, content.mesh_bytes}, sink, &zip);
      else
        emit({file, content.sources.at(i).output_nbytes(), &content.sources[i], {}}, sink, &zip);
    });
  });
}

Published RankFilesWriter::publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) {
  return publish_directory(dir_, names_, data_path, force, durable, nullptr);
}

const char* rank_layout_name(RankLayout layout) {
  return layout == RankLayout::kShardedTensor ? "fsdp-sharded-tensor" : "fsdp-dtensor";
}

}  // namespace ckpt
