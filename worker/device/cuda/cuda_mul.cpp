// CUDA backend: the product of two tensors (BinaryKind kMul: b shaped like
// a, or one factor per sample and channel broadcast over H and W) and the
// gradient of a broadcast factor (kMulSum: the sum of a * b over H and W),
// in our kernels (cuda_kernels.h: mul, mul_sum). Inputs whose layout
// differs from the one the kernel walks are reordered into the scratch
// first; a broadcast b and kMulSum's y are read and written in any layout.
#include "worker/device/cuda/cuda_backend_impl.h"

namespace vtrain::worker::cuda {

namespace {

// The staged copies a call takes, in order: kMul's a and a same-shaped b
// in y's layout; kMulSum's b in a's layout.
struct MulStaging {
  bool a = false, b = false;
  size_t copy_bytes = 0;
  size_t bytes() const { return (a ? copy_bytes : 0) + (b ? copy_bytes : 0); }
};

MulStaging mul_staging(BinaryKind kind, const TensorDesc& a, const TensorDesc& b,
                       const TensorDesc& y) {
  if (kind == BinaryKind::kMulSum) return {false, b.layout != a.layout, align_up(a.bytes())};
  return {a.layout != y.layout, b.shape == a.shape && b.layout != y.layout, align_up(y.bytes())};
}

}  // namespace

size_t CudaBackend::mul_scratch_bytes(BinaryKind kind, const TensorDesc& a, const TensorDesc& b,
                                      const TensorDesc& y) {
  return mul_staging(kind, a, b, y).bytes();
}

void CudaBackend::mul(const Tensor& a, const Tensor& b, const Tensor& y, float beta) {
  const bool broadcast = check_mul("cuda backend", {BinaryKind::kMul, a.desc, b.desc, y.desc, beta});
  const DataType type = call_type("mul", {a.desc, b.desc, y.desc});
  const MulStaging staging = mul_staging(BinaryKind::kMul, a.desc, b.desc, y.desc);
  char* ws = staging.bytes() > 0 ? scratch(staging.bytes()) : nullptr;
  const void* pa = in_layout(a, y.desc.layout, ws);
  const void* pb = broadcast ? b.data
                             : in_layout(b, y.desc.layout, ws + (staging.a ? staging.copy_bytes : 0));
  cuda::mul(element(type), pa, pb, broadcast ? channel_block(b.desc) : 0, y.data, beta,
            blocked(y.desc), compute_.get());
}

void CudaBackend::mul_sum(const Tensor& a, const Tensor& b, const Tensor& y, float beta) {
  check_mul("cuda backend", {BinaryKind::kMulSum, a.desc, b.desc, y.desc, beta});
  const DataType type = call_type("mul_sum", {a.desc, b.desc, y.desc});
  const MulStaging staging = mul_staging(BinaryKind::kMulSum, a.desc, b.desc, y.desc);
  char* ws = staging.bytes() > 0 ? scratch(staging.bytes()) : nullptr;
  cuda::mul_sum(element(type), a.data, in_layout(b, a.desc.layout, ws), y.data,
                channel_block(y.desc), beta, blocked(a.desc), compute_.get());
}

}  // namespace vtrain::worker::cuda
