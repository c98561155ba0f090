// The CUDA backend's dropout kernel runs dropout_at (dropout_body.h) for
// each storage index of its grid-stride loop; here every index of a launch
// runs on the host, in both index types the kernel instantiates, over NCHW,
// nChw8c, nChw16c (20 channels: padded) and NHWC, and each element must be
// the reference's dropout of its logical element under the host's mask
// (worker/engine/dropout_mask.h), padding channels 0. Plain C++: every
// build, GPU or not; the device's own run is in backend_conformance_dropout_test.
#include "worker/device/cuda/dropout_body.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/reference_ops.h"
#include "worker/engine/dropout_mask.h"

namespace vtrain::worker::cuda {
namespace {

// f32 storage: the conversions are the identity.
struct FloatStorage {
  static float to_float(float v) { return v; }
  template <typename T>
  static T from_float(float v) {
    return v;
  }
};

template <typename I>
void check_layouts() {
  const int64_t n = 3, c = 20, hw = 6;
  const DropoutKey key{7, 5, 2};
  const float p = 0.3f;
  const int64_t first_sample = 11;
  const DropoutCall call{dropout_layer_stream(key), first_sample, dropout_threshold(p),
                         dropout_scale(p)};
  reference::Vec logical(static_cast<size_t>(n * c * hw));
  for (size_t i = 0; i < logical.size(); ++i) logical[i] = 0.25f * static_cast<float>(i % 37) - 4;
  std::vector<uint8_t> keep(logical.size());
  dropout_mask(key, p, first_sample, n, c * hw, keep.data());
  const reference::Vec expected = reference::dropout_apply(logical, keep, p);
  for (int64_t block : {int64_t{1}, int64_t{8}, int64_t{16}, c}) {
    SCOPED_TRACE("block " + std::to_string(block));
    const int64_t storage = n * padded_channels(c, block) * hw;
    std::vector<float> in(static_cast<size_t>(storage), 7.0f);  // padding: not 0, to see it zeroed
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t ch = 0; ch < c; ++ch) {
        for (int64_t px = 0; px < hw; ++px) {
          in[static_cast<size_t>(offset_of<int64_t>({s, ch, px}, c, hw, block))] =
              logical[static_cast<size_t>((s * c + ch) * hw + px)];
        }
      }
    }
    std::vector<float> out(in.size(), -1.0f);
    for (int64_t i = 0; i < storage; ++i) {
      dropout_at<FloatStorage>(static_cast<I>(i), in.data(), out.data(), static_cast<I>(c),
                               static_cast<I>(hw), static_cast<I>(block), call);
    }
    for (int64_t i = 0; i < storage; ++i) {
      const Position<int64_t> at = position_of<int64_t>(i, c, hw, block);
      const float want =
          at.c < c ? expected[static_cast<size_t>((at.n * c + at.c) * hw + at.s)] : 0.0f;
      ASSERT_FLOAT_EQ(out[static_cast<size_t>(i)], want)
          << "storage " << i << ": sample " << at.n << " channel " << at.c << " pixel " << at.s;
    }
  }
}

TEST(DropoutBody, EveryLayoutDrawsTheHostMaskInLogicalOrder) {
  check_layouts<int64_t>();
  check_layouts<uint32_t>();
}

}  // namespace
}  // namespace vtrain::worker::cuda
