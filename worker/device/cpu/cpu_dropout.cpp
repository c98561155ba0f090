// CPU backend: dropout (DropoutDesc), its mask drawn element by element
// from the key (worker/device/dropout_draw.h), never stored.
#include <cstdint>
#include <vector>

#include "worker/device/cpu/cpu_backend_impl.h"
#include "worker/device/dropout_draw.h"

namespace vtrain::worker::cpu {
namespace {

// out = dropout(in) over a tensor of d.x's shape and layout: its storage is
// runs of `block` channels (1: NCHW; 8, 16: nChw8c, nChw16c with padding
// channels; c: NHWC), one run per (sample, channel block, pixel), which the
// threads share out. Each element draws under its logical index c * hw +
// pixel, so every layout gets the same mask; padding channels stay 0.
template <class T>
void dropout_runs(const DropoutDesc& d, const T* in, T* out) {
  const Shape& s = d.x.shape;
  const int64_t block = channel_block(d.x);
  const int64_t blocks = (s.c + block - 1) / block;
  const int64_t hw = s.h * s.w;
  const uint32_t threshold = dropout_threshold(d.p);
  const float scale = dropout_scale(d.p);
  const uint64_t layer = dropout_layer_stream(d.key);
  std::vector<uint64_t> streams(static_cast<size_t>(s.n));
  for (int64_t n = 0; n < s.n; ++n) {
    streams[static_cast<size_t>(n)] = dropout_sample_stream(layer, d.first_sample + n);
  }
  const int64_t runs = s.n * blocks * hw;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t n = r / (blocks * hw), first_channel = r / hw % blocks * block, pixel = r % hw;
    const uint64_t stream = streams[static_cast<size_t>(n)];
    for (int64_t l = 0; l < block; ++l) {
      const int64_t c = first_channel + l;
      const int64_t at = r * block + l;
      store(out + at,
            c < s.c ? dropout_value(load(in + at), stream, c * hw + pixel, threshold, scale) : 0.0f);
    }
  }
}

}  // namespace

void CpuBackend::dropout(const DropoutDesc& d, const Tensor& in, const Tensor& out) {
  with_element_type(d.x.dtype, [&](auto zero) {
    using T = decltype(zero);
    dropout_runs(d, static_cast<const T*>(in.data), static_cast<T*>(out.data));
  });
}

}  // namespace vtrain::worker::cpu
