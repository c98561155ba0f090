// CUDA backend: dropout (DropoutDesc), one kernel over the storage whose
// threads draw their element's mask from the key (dropout_body.h).
#include "worker/device/cuda/cuda_backend_impl.h"
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/dropout_body.h"

namespace vtrain::worker::cuda {

void CudaBackend::dropout(const DropoutDesc& d, const Tensor& in, const Tensor& out) {
  const DataType type = call_type("dropout", {d.x});
  const DropoutCall call{dropout_layer_stream(d.key), d.first_sample, dropout_threshold(d.p),
                         dropout_scale(d.p)};
  cuda::dropout(element(type), in.data, out.data, blocked(d.x), call, compute_.get());
}

}  // namespace vtrain::worker::cuda
