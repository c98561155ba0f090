// What one thread of the CUDA backend's dropout kernel does for one storage
// index of its grid-stride loop (DropoutDesc, ops.h): the element's logical
// position from the layout (kernel_bodies.h's position_of), its draw from
// the key (worker/device/dropout_draw.h, __host__ __device__), and the
// kept value. Plain C++ like kernel_bodies.h: the kernel (cuda_kernels.cu)
// and the host test (dropout_body_test) run this code.
#pragma once

#include <cstdint>

#include "worker/device/cuda/kernel_bodies.h"
#include "worker/device/dropout_draw.h"

namespace vtrain::worker::cuda {

// A dropout call's constants, computed once on the host.
struct DropoutCall {
  uint64_t layer_stream = 0;  // dropout_layer_stream(key)
  int64_t first_sample = 0;   // the global batch index of the call's sample 0
  uint32_t threshold = 0;     // dropout_threshold(p)
  float scale = 1.0f;         // dropout_scale(p)
};

// out[i] = the dropout of in[i], storage index i of a {n, c, hw} tensor
// with channel block `block`; padding channels become 0. out may alias in.
template <typename C, typename T, typename I>
VTRAIN_KERNEL_BODY void dropout_at(I i, const T* in, T* out, I c, I hw, I block,
                                   const DropoutCall& call) {
  const Position<I> p = position_of(i, c, hw, block);
  float v = 0.0f;
  if (p.c < c) {
    const uint64_t stream =
        dropout_sample_stream(call.layer_stream, call.first_sample + static_cast<int64_t>(p.n));
    v = dropout_value(C::to_float(in[i]), stream, static_cast<int64_t>(p.c * hw + p.s),
                      call.threshold, call.scale);
  }
  out[i] = C::template from_float<T>(v);
}

}  // namespace vtrain::worker::cuda
