#include "exec/write_dcp_hf.h"

#include <memory>

#include "core/error.h"
#include "exec/write_dcp.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"
#include "model/tree_walk.h"

namespace ckpt {

std::vector<std::vector<dcp_hf::Piece>> dcp_hf_pieces(const CheckpointModel& model, const ReshardPlan& plan) {
  dcp::DcpMetadata layout = flattened_layout(model);
  std::vector<std::vector<dcp_hf::Piece>> out(static_cast<std::size_t>(plan.world_size));
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
    for (const auto& [rank, index] : plan.items_of_tensor.at(*tensor)) {
      const OutputItem& oi = plan.ranks.at(static_cast<std::size_t>(rank)).at(index);
      out.at(static_cast<std::size_t>(rank)).push_back({index, item.fqn, t.output_dtype(), oi.offsets, oi.sizes});
    }
  }
  return out;
}

std::vector<std::vector<std::pair<std::string, uint64_t>>> dcp_hf_output_sizes(
    const std::vector<std::vector<dcp_hf::Piece>>& pieces) {
  std::vector<std::vector<std::pair<std::string, uint64_t>>> out(pieces.size());
  for (std::size_t r = 0; r < pieces.size(); ++r) {
    if (pieces[r].empty()) continue;
    safetensors::FilePlan file = dcp_hf::plan_rank_file(static_cast<int>(r), pieces[r]);
    out[r].emplace_back(file.file_name, 8 + file.header.size() + file.data_size);
  }
  return out;
}

void write_dcp_hf_reshard(const CheckpointModel& model, const ReshardPlan& plan,
                          const std::vector<std::vector<dcp_hf::Piece>>& pieces, const DcpHfOutputOptions& options) {
  AtomicDirectory dir(options.dir, options.force, options.durable);
  for (std::size_t r = 0; r < pieces.size(); ++r) {
    if (pieces[r].empty()) continue;  // torch writes no file for an empty save plan
    safetensors::FilePlan file = dcp_hf::plan_rank_file(static_cast<int>(r), pieces[r]);
    auto sink = AtomicFileSink::create(dir.path_of(file.file_name), false, options.durable);
    with_context(dir.destination() + "/" + file.file_name, [&] {
      safetensors::write_safetensors_file(*sink, file, [&](std::size_t index, ByteSink& s) {
        const OutputItem& oi = plan.ranks[r].at(index);
        append_tensor(item_tensor(model.tensors.at(oi.tensor), oi), s, options.copy);
      });
    });
    sink->finish();
  }
  if (options.copy.verify) options.copy.verify->check_deferred();  // before anything is published
  dir.commit();
}

}  // namespace ckpt
