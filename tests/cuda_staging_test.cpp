// What a CUDA convolution call's workspace holds before cuDNN's part
// (ConvStaging, worker/device/cuda/cuda_backend_impl.h): host arithmetic,
// run without a GPU in CUDA builds. The weight gradient's staging holds the
// bias gradient's partial sums (cuda::bias_gradient) wherever our kernel
// computes it, enough for the call and never less for a larger batch: a
// step's last micro-batch may be smaller than the one its workspace was
// sized for.
#include <gtest/gtest.h>

#include <string>

#include "tests/backend_test_support.h"
#include "worker/device/cuda/cuda_backend_impl.h"

namespace vtrain::worker::cuda {
namespace {

TEST(ConvStaging, WeightGradientHoldsTheBiasPartialsAndNeverLessForALargerBatch) {
  for (DataType type : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
    for (Layout layout : {Layout::kPlain, Layout::kNhwc}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + layout_name(layout));
      size_t previous = 0;
      for (int64_t n = 1; n <= 256; ++n) {
        const ConvProblem p = backend_test::conv_problem({"staging", 16, 28, 28, 40, 3, 1, 1, n},
                                                         layout, layout, type);
        const ConvStaging filter = conv_staging(ConvKind::kBackwardFilter, p);
        EXPECT_EQ(conv_staging(ConvKind::kForward, p).bias_partials, 0u);
        EXPECT_EQ(conv_staging(ConvKind::kBackwardData, p).bias_partials, 0u);
        if (type == DataType::kF32 && layout == Layout::kPlain) {
          EXPECT_EQ(filter.bias_partials, 0u) << "cuDNN sums f32 NCHW bias gradients";
          continue;
        }
        const Shape& y = p.y.shape;
        ASSERT_GE(filter.bias_partials,
                  static_cast<size_t>(bias_gradient_partial_bytes(
                      y.n, y.c, y.h * y.w, layout == Layout::kNhwc)))
            << "n " << n;
        ASSERT_GE(filter.bias_partials, previous) << "n " << n;
        EXPECT_EQ(filter.bias_partials_offset() + filter.bias_partials, filter.total());
        EXPECT_EQ(filter.bias_partials_offset() % kAlign, 0u);
        previous = filter.bias_partials;
      }
    }
  }
}

}  // namespace
}  // namespace vtrain::worker::cuda
