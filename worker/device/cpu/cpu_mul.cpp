// CPU backend: the product of two tensors (BinaryKind kMul: b shaped like
// a, or one factor per sample and channel broadcast over H and W) and the
// gradient of a broadcast factor (kMulSum: the sum of a * b over H and W).
// oneDNN's binary primitive broadcasts b itself; kMulSum is that product
// into an f32 temporary in the scratch, then a reduction primitive.
#include "worker/device/cpu/cpu_backend_impl.h"

namespace vtrain::worker::cpu {

namespace {

// kMulSum's product: a's shape and layout, in f32 whatever the tensors'
// type, so the sum adds unrounded products.
TensorDesc product_desc(const TensorDesc& a) { return {a.shape, a.layout, DataType::kF32}; }

// Where kMulSum's reduction sums anything: a with one pixel is the
// product itself (and oneDNN refuses a reduction over nothing).
bool sums_pixels(const TensorDesc& a) { return a.shape.h * a.shape.w > 1; }

}  // namespace

// y = a * b, + y with `accumulate` (a sum post-op); oneDNN broadcasts a b
// whose H and W are 1.
const dnnl::binary::primitive_desc& CpuBackend::mul_pd(const TensorDesc& a, const TensorDesc& b,
                                                       const TensorDesc& y, bool accumulate) {
  return cached<dnnl::binary::primitive_desc>(
      "mul" + shape_key(a) + shape_key(b) + shape_key(y) + (accumulate ? "+y" : ""), [&] {
        dnnl::binary::desc d(dnnl::algorithm::binary_mul, md_of(a), md_of(b), md_of(y));
        return dnnl::binary::primitive_desc(d, user_scratchpad_attr(accumulate), engine_);
      });
}

// y = the sum of `product` over H and W, + y with `accumulate`.
const dnnl::reduction::primitive_desc& CpuBackend::pixel_sum_pd(const TensorDesc& product,
                                                                const TensorDesc& y,
                                                                bool accumulate) {
  return cached<dnnl::reduction::primitive_desc>(
      "pixel_sum" + shape_key(product) + shape_key(y) + (accumulate ? "+y" : ""), [&] {
        dnnl::reduction::desc d(dnnl::algorithm::reduction_sum, md_of(product), md_of(y), 0.0f,
                                0.0f);
        return dnnl::reduction::primitive_desc(d, user_scratchpad_attr(accumulate), engine_);
      });
}

size_t CpuBackend::mul_scratch_bytes(BinaryKind kind, const TensorDesc& a, const TensorDesc& b,
                                     const TensorDesc& y) {
  try {
    if (kind == BinaryKind::kMul || !sums_pixels(a)) {
      return std::max(mul_pd(a, b, y, false).scratchpad_desc().get_size(),
                      mul_pd(a, b, y, true).scratchpad_desc().get_size());
    }
    const TensorDesc p = product_desc(a);
    return align_up(p.bytes()) +
           std::max({mul_pd(a, b, p, false).scratchpad_desc().get_size(),
                     pixel_sum_pd(p, y, false).scratchpad_desc().get_size(),
                     pixel_sum_pd(p, y, true).scratchpad_desc().get_size()});
  } catch (const dnnl::error& e) {
    rethrow(std::string(binary_name(kind)) + " " + a.shape.str() + " by " + b.shape.str(), e);
  }
}

void CpuBackend::mul(const Tensor& a, const Tensor& b, const Tensor& y, float beta) {
  check_mul("cpu backend", {BinaryKind::kMul, a.desc, b.desc, y.desc, beta});
  try {
    const auto& pd = mul_pd(a.desc, b.desc, y.desc, beta != 0.0f);
    execute(dnnl::binary(pd), {{DNNL_ARG_SRC_0, mem(pd.src_desc(0), a.data)},
                               {DNNL_ARG_SRC_1, mem(pd.src_desc(1), b.data)},
                               {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
                               {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
  } catch (const dnnl::error& e) {
    rethrow("mul " + a.shape().str() + " by " + b.shape().str(), e);
  }
}

// Two primitives with the f32 product between them: oneDNN's reduction
// takes no elementwise input op.
void CpuBackend::mul_sum(const Tensor& a, const Tensor& b, const Tensor& y, float beta) {
  check_mul("cpu backend", {BinaryKind::kMulSum, a.desc, b.desc, y.desc, beta});
  if (!sums_pixels(a.desc)) {  // y[n, c] is the product of one pixel
    mul(a, b, y, beta);
    return;
  }
  const TensorDesc p = product_desc(a.desc);
  try {
    const auto& product_pd = mul_pd(a.desc, b.desc, p, false);
    const auto& sum_pd = pixel_sum_pd(p, y.desc, beta != 0.0f);
    const size_t product_bytes = align_up(p.bytes());
    char* ws = scratch(product_bytes + std::max(product_pd.scratchpad_desc().get_size(),
                                                sum_pd.scratchpad_desc().get_size()));
    char* pad = ws + product_bytes;
    execute(dnnl::binary(product_pd),
            {{DNNL_ARG_SRC_0, mem(product_pd.src_desc(0), a.data)},
             {DNNL_ARG_SRC_1, mem(product_pd.src_desc(1), b.data)},
             {DNNL_ARG_DST, mem(product_pd.dst_desc(), ws)},
             {DNNL_ARG_SCRATCHPAD, mem(product_pd.scratchpad_desc(), pad)}});
    execute(dnnl::reduction(sum_pd), {{DNNL_ARG_SRC, mem(sum_pd.src_desc(), ws)},
                                      {DNNL_ARG_DST, mem(sum_pd.dst_desc(), y.data)},
                                      {DNNL_ARG_SCRATCHPAD, mem(sum_pd.scratchpad_desc(), pad)}});
  } catch (const dnnl::error& e) {
    rethrow("mul_sum " + a.shape().str(), e);
  }
}

}  // namespace vtrain::worker::cpu
