#include "model_io/weights_export.h"

#include <vector>

#include "model_io/safetensors.h"
#include "model_io/weight_names.h"

namespace vtrain::model_io {

ExportSummary export_safetensors(const worker::Graph& graph, const std::string& preset,
                                 const worker::Checkpoint& ckpt, const std::string& out) {
  const std::vector<ModelTensor> named = model_tensors(graph, preset);
  const int64_t batches = ckpt.step;  // every step updates the running statistics once
  std::vector<TensorToWrite> tensors;
  for (const ModelTensor& t : named) {
    TensorToWrite w{t.name, Dtype::kF32, t.shape, nullptr};
    if (t.kind == WeightKind::kParameter) w.data = ckpt.parameters.data() + t.offset;
    if (t.kind == WeightKind::kBuffer) w.data = ckpt.buffers.data() + t.offset;
    if (t.kind == WeightKind::kBatchCount) {
      w.dtype = Dtype::kI64;
      w.data = &batches;
    }
    tensors.push_back(std::move(w));
  }
  const bool torchvision = torchvision_architecture(preset);
  const uint64_t bytes = write_safetensors(out, tensors,
                    {{"format", "pt"},
                     {"vtrain.names", torchvision ? "torchvision" : "vtrain"},
                     {"vtrain.step", std::to_string(ckpt.step)},
                     {"vtrain.model", ckpt.model_signature}});
  return {static_cast<int64_t>(tensors.size()), bytes, torchvision};
}

}  // namespace vtrain::model_io
