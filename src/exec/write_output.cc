#include "exec/write_output.h"

#include "core/error.h"
#include "formats/torch_pt/pt_writer.h"
#include "io/byte_sink.h"
#include "model/validate.h"

namespace ckpt {

void write_pt_output(const CheckpointModel& model, const OutputOptions& options) {
  require_valid(model);
  std::vector<torch_pt::OutputTensor> tensors;
  tensors.reserve(model.tensors.size());
  for (const auto& t : model.tensors)
    tensors.push_back({t.output_dtype(), t.shape, t.stored_as == "Parameter", t.requires_grad});
  auto sink = AtomicFileSink::create(options.path, options.force);
  with_context(options.path, [&] {
    torch_pt::write_pt(*sink, *model.root, tensors, [&](std::size_t index, archive::ZipWriter& zip) {
      append_tensor(model.tensors[index], zip, options.copy);
    });
  });
  sink->finish();
}

}  // namespace ckpt
