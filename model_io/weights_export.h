// `vtrain export --format safetensors`: a checkpoint's weights as a
// safetensors file that torch reads (safetensors.torch.load_file), named as
// model_io/weight_names.h says, so that torchvision's model of a preset
// loads it with load_state_dict(strict=True).
#pragma once

#include <cstdint>
#include <string>

#include "worker/engine/graph.h"
#include "worker/train/checkpoint.h"

namespace vtrain::model_io {

struct ExportSummary {
  int64_t tensors = 0;       // tensors written
  uint64_t bytes = 0;        // the file's size
  bool torchvision = false;  // written with torchvision's names
};

// Writes the parameters and batch-norm running statistics of `ckpt` (a
// checkpoint of `graph`, checked by the caller: check_checkpoint_matches)
// to `out` as F32 tensors; with torchvision's names each batch norm also
// gets num_batches_tracked (I64), the checkpoint's step count. The metadata
// holds {"format": "pt"} (what safetensors.torch writes), the naming, the
// step and the model signature. `out` is written whole or not at all
// (common::OutputError).
ExportSummary export_safetensors(const worker::Graph& graph, const std::string& preset,
                                 const worker::Checkpoint& ckpt, const std::string& out);

}  // namespace vtrain::model_io
