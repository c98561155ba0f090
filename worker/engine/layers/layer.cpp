#include "worker/engine/layers/layer.h"

namespace vtrain::worker {

void upload_floats(Backend& backend, const std::vector<float>& host, float* device) {
  if (host.empty()) return;
  backend.upload(host.data(), Tensor{vector_desc(static_cast<int64_t>(host.size())), device});
}

std::vector<float> download_floats(Backend& backend, const float* device, int64_t count) {
  std::vector<float> host(static_cast<size_t>(count));
  if (count > 0) {
    backend.download(Tensor{vector_desc(count), const_cast<float*>(device)}, host.data());
  }
  return host;
}

}  // namespace vtrain::worker
