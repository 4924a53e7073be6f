#include "exec/write_dcp_hf.h"

#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "exec/parted_output.h"
#include "exec/write_dcp.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"
#include "model/tree_walk.h"

namespace ckpt {

namespace {

// torch's HuggingFaceStorageReader takes its dtypes from safetensors.torch's
// table (`_getdtype`), which in safetensors 0.8 lacks these two that
// safetensors itself writes and safe_open reads: that reader stops with a
// KeyError on them, from_pretrained and safe_open load them.
bool unknown_to_torch_hf_reader(DType d) { return d == DType::kFloat4E2M1FNx2 || d == DType::kFloat8E8M0FNU; }

}  // namespace

std::vector<std::vector<dcp_hf::Piece>> dcp_hf_pieces(const CheckpointModel& model, const ReshardPlan& plan) {
  dcp::DcpMetadata layout = flattened_layout(model);
  std::vector<std::vector<dcp_hf::Piece>> out(static_cast<std::size_t>(plan.world_size));
  std::vector<std::string> unreadable;
  for (const dcp::ItemMeta& item : layout.items) {
    std::optional<std::size_t> tensor;
    if (item.is_tensor)
      tensor = tensor_ref_index(*value_at_path(model.root, layout.planner_data.at(item.fqn), item.fqn));
    if (!tensor) {
      // A training checkpoint ({"model": ..., "optim": ...}) is the usual case: say so.
      pickle::ValuePtr root = mapping_of(model.root);
      bool training = root->is(pickle::Kind::kDict) && root->get("model") && root->entries.size() > 1;
      fail_invalid(model.source + ": the Hugging Face layout holds a model's tensors only, and '" + item.fqn +
                   "' is not a tensor" +
                   (training ? "; the checkpoint holds more than a model: add --only model" : "; add --only model") +
                   " (or use --layout dcp, which keeps everything)");
    }
    const TensorEntry& t = model.tensors.at(*tensor);
    if (unknown_to_torch_hf_reader(t.output_dtype()))
      unreadable.push_back(item.fqn + " (" + std::string(dtype_name(t.output_dtype())) + ")");
    for (const auto& [rank, index] : plan.items_of_tensor.at(*tensor)) {
      const OutputItem& oi = plan.ranks.at(static_cast<std::size_t>(rank)).at(index);
      out.at(static_cast<std::size_t>(rank)).push_back({index, item.fqn, t.output_dtype(), oi.offsets, oi.sizes});
    }
  }
  if (!unreadable.empty())
    log::warn(std::to_string(unreadable.size()) + " tensor(s) of a dtype torch's HuggingFaceStorageReader cannot map " +
              "(safetensors.torch's dtype table, 0.8): " + unreadable.front() + (unreadable.size() > 1 ? ", ..." : "") +
              "; from_pretrained and safe_open read them, torch's dcp.load of this folder stops on them");
  return out;
}

DcpHfWriter::DcpHfWriter(const CheckpointModel& model, const ReshardPlan& plan,
                         const std::vector<std::vector<dcp_hf::Piece>>& pieces, std::string dir)
    : dir_(without_trailing_slashes(std::move(dir))) {
  require_distinct_paths(*model.root, "a DCP Hugging Face checkpoint");
  for (std::size_t r = 0; r < pieces.size(); ++r) {
    if (pieces[r].empty()) continue;
    files_.push_back(dcp_hf::plan_rank_file(static_cast<int>(r), pieces[r]));
    ranks_.push_back(static_cast<int>(r));
    std::vector<TensorEntry>& items = sources_.emplace_back();
    for (const OutputItem& oi : plan.ranks.at(r)) items.push_back(item_tensor(model.tensors.at(oi.tensor), oi));
  }
}

std::vector<std::string> DcpHfWriter::file_names() const {
  std::vector<std::string> names;
  for (const auto& f : files_) names.push_back(f.file_name);
  return names;
}

void DcpHfWriter::run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) {
  for (std::size_t k = 0; k < files_.size(); ++k)
    safetensors::write_safetensors_file(*sinks.at(k), files_[k], [&](std::size_t index, ByteSink& s) {
      const TensorEntry& t = sources_[k].at(index);
      emit({k, t.output_nbytes(), &t, {}}, s, nullptr);
    });
}

Published DcpHfWriter::publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool durable) {
  return publish_directory(dir_, file_names(), data_path, force, durable, nullptr);
}

}  // namespace ckpt
