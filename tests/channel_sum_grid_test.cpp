// The CUDA backend's per-channel reductions (bias gradients, synchronised
// batch-norm sums) split a tensor among blocks and threads by
// channel_sum_grid.h, plain C++ shared with the kernels. Here every
// (block, thread) of the grid is walked on the host: each element of the
// tensor must be summed exactly once, into its own channel, and the grid
// must stay within its bounds. Runs on every machine; the kernels' sums
// themselves are checked against the reference on a GPU
// (backend_conformance_test, cuda_backend_test).
#include "worker/device/cuda/channel_sum_grid.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace vtrain::worker::cuda {
namespace {

struct Case {
  int64_t n, c, hw;
  bool channels_last;
  int vec = 1;
};

std::string describe(const Case& k) {
  std::ostringstream out;
  out << "{" << k.n << ", " << k.c << ", " << k.hw << "} " << (k.channels_last ? "NHWC" : "NCHW")
      << ", vec " << k.vec;
  return out.str();
}

// The channel that element `at` of {n, c, hw} belongs to.
int64_t channel_of(const Case& k, int64_t at) {
  return k.channels_last || k.hw == 1 ? at % k.c : at / k.hw % k.c;
}

TEST(ChannelSumGrid, EveryElementIsSummedOnceIntoItsChannel) {
  std::vector<Case> cases = {
      {1, 1, 1, false},     {1, 1, 1, true},      {2, 3, 5, false},    {2, 3, 5, true},
      {64, 10, 1, false},   {64, 4096, 1, false}, {3, 31, 7, true},    {3, 33, 7, true},
      {4, 64, 49, false},   {4, 64, 49, true},    {2, 100, 300, false}, {2, 100, 300, true},
      {8, 64, 3136, true},  {8, 64, 3136, false}, {1, 512, 196, true}, {5, 7, 1031, false},
      {16, 3, 2000, true},  {16, 3, 2000, false}, {1, 1, 100000, false}};
  // Packs of 8 (half) and 4 (float) channels: where c is a multiple (up to
  // 32 packs a pixel, fewer, and a count that is no power of two), and
  // where it is not or the layout is NCHW (one channel a thread then).
  for (int vec : {8, 4}) {
    for (const Case k : {Case{8, 64, 3136, true}, Case{2, 40, 300, true}, Case{1, 512, 196, true},
                         Case{64, 4096, 1, false}, Case{3, 8, 7, true}, Case{2, 100, 30, true},
                         Case{3, 33, 7, true}, Case{4, 64, 49, false}, Case{2, 3, 5, true}}) {
      Case v = k;
      v.vec = vec;
      cases.push_back(v);
    }
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(describe(k));
    const ChannelSumGrid g = channel_sum_grid(k.n, k.c, k.hw, k.channels_last, k.vec);
    const bool packed = (k.channels_last || k.hw == 1) && k.c % k.vec == 0;
    ASSERT_EQ(g.vec, packed ? k.vec : 1);
    ASSERT_GE(g.chunks, 1);
    ASSERT_GE(g.groups, 1);
    ASSERT_EQ(g.lanes_c * g.lanes_p, kChannelSumThreads);
    // The block tree halves lanes_p: it must be a power of two.
    ASSERT_EQ(g.lanes_p & (g.lanes_p - 1), 0);
    ASSERT_EQ(g.groups, (k.c + g.lanes_c * g.vec - 1) / (g.lanes_c * g.vec));
    // No empty chunk: the last one starts inside the tensor.
    ASSERT_LT((g.chunks - 1) * g.chunk_pixels, k.n * k.hw);
    // The chunks are one channel a thread's, whatever vec.
    ASSERT_EQ(g.chunks, channel_sum_grid(k.n, k.c, k.hw, k.channels_last).chunks);
    std::vector<int> visits(static_cast<size_t>(k.n * k.c * k.hw), 0);
    bool wrong_channel = false, out_of_range = false, bad_run = false, unordered = false;
    for (int64_t chunk = 0; chunk < g.chunks; ++chunk) {
      for (int64_t group = 0; group < g.groups; ++group) {
        for (int t = 0; t < kChannelSumThreads; ++t) {
          int64_t last = -1;
          g.for_each_run(chunk, group, t, [&](const int64_t (&at)[kChannelSumUnroll], int count,
                                              int64_t ch) {
            if (count < 1 || count > kChannelSumUnroll) {
              bad_run = true;
              return;
            }
            for (int u = 0; u < count; ++u) {
              // A thread's pixels come in increasing order (the sums' order).
              if (at[u] <= last) unordered = true;
              last = at[u];
              for (int l = 0; l < g.vec; ++l) {
                const int64_t e = at[u] + l;
                if (e < 0 || e >= static_cast<int64_t>(visits.size())) {
                  out_of_range = true;
                  return;
                }
                ++visits[static_cast<size_t>(e)];
                // A thread sums its pack's channels, the ones its block's tree reduces.
                if (ch + l != channel_of(k, e) ||
                    ch != (group * g.lanes_c + t % g.lanes_c) * g.vec) {
                  wrong_channel = true;
                }
              }
            }
          });
        }
      }
    }
    EXPECT_FALSE(bad_run);
    EXPECT_FALSE(unordered);
    EXPECT_FALSE(out_of_range);
    EXPECT_FALSE(wrong_channel);
    int64_t missed = 0, twice = 0;
    for (int v : visits) {
      missed += v == 0;
      twice += v > 1;
    }
    EXPECT_EQ(missed, 0);
    EXPECT_EQ(twice, 0);
  }
}

// Workspace sized for a micro-batch must serve every smaller call (the last
// micro-batch of a step may be smaller): the partial sums' bytes never
// shrink as n grows, and always cover the grid's partials. Rounding the
// chunk size up once made {334, 16, 196} need more than {384, 16, 196}.
TEST(ChannelSumGrid, PartialBytesGrowWithTheBatchAndCoverThePartials) {
  for (int64_t c : {1, 3, 16, 64, 100}) {
    for (int64_t hw : {1, 7, 196, 3136}) {
      for (bool nhwc : {false, true}) {
        int64_t previous = 0;
        for (int64_t n = 1; n <= 512; ++n) {
          const ChannelSumGrid g = channel_sum_grid(n, c, hw, nhwc);
          const int64_t bytes = channel_sum_partial_bytes(n, c, hw, nhwc, 2, 8);
          ASSERT_GE(bytes, previous) << describe({n, c, hw, nhwc});
          ASSERT_GE(bytes, g.partials() * 2 * 8) << describe({n, c, hw, nhwc});
          ASSERT_LE(g.chunks, g.chunk_bound) << describe({n, c, hw, nhwc});
          previous = bytes;
        }
      }
    }
  }
}

// The grid's size on the shapes that matter (VGG-16's and ResNet-50's at
// batch 64, an inner product's): enough blocks to fill a GPU where the
// tensor is large, few where it is small, and partial sums that stay small
// (they are workspace the memory plan counts).
TEST(ChannelSumGrid, FillsTheGpuOnLargeTensorsAndStaysSmallOnSmallOnes) {
  // VGG-16 conv1_2's dy at batch 64: 64 channels of 224x224.
  const ChannelSumGrid vgg = channel_sum_grid(64, 64, 224 * 224, true);
  EXPECT_GE(vgg.chunks * vgg.groups, kChannelSumTargetBlocks - vgg.groups);
  EXPECT_LE(vgg.chunks * vgg.groups, kChannelSumTargetBlocks + vgg.groups);
  EXPECT_EQ(vgg.lanes_c, 32);
  // The old kernel's 64 blocks walked 3.2 million pixels each; now each
  // thread sums a few thousand.
  EXPECT_LE(vgg.chunk_pixels / vgg.lanes_p, 64 * 224 * 224 / 400);
  EXPECT_LE(channel_sum_partial_bytes(64, 64, 224 * 224, true, 1, 4), 128 * 1024);
  // In packs of 8 bf16 channels: 8 threads a pixel, 32 pixels a block, the
  // same chunks, and every block's thread reading 16 bytes a load.
  const ChannelSumGrid packed = channel_sum_grid(64, 64, 224 * 224, true, 8);
  EXPECT_EQ(packed.vec, 8);
  EXPECT_EQ(packed.lanes_c, 8);
  EXPECT_EQ(packed.groups, 1);
  EXPECT_EQ(packed.chunks, vgg.chunks);

  // NCHW: one channel a block, the chunks along its pixels.
  const ChannelSumGrid nchw = channel_sum_grid(64, 64, 224 * 224, false);
  EXPECT_EQ(nchw.lanes_c, 1);
  EXPECT_GE(nchw.chunks * nchw.groups, kChannelSumTargetBlocks - nchw.groups);

  // An inner product's dy {64, 4096, 1}: each thread sums at least
  // kChannelSumMinPixelsPerThread rows or the whole batch.
  const ChannelSumGrid fc = channel_sum_grid(64, 4096, 1, false);
  EXPECT_TRUE(fc.channels_last);
  EXPECT_EQ(fc.chunks, 1);
  EXPECT_EQ(channel_sum_partial_bytes(64, 4096, 1, false, 1, 4), 4096 * 4);

  // A small tensor takes one chunk.
  EXPECT_EQ(channel_sum_grid(2, 8, 16, true).chunks, 1);

  // The partial sums never exceed about kChannelSumTargetBlocks * 32 per
  // quantity, whatever the shape (ResNet-50's widest: 2048 channels).
  for (int64_t c : {1, 3, 64, 256, 2048}) {
    for (int64_t hw : {1, 49, 3136, 50176}) {
      for (bool nhwc : {false, true}) {
        const ChannelSumGrid g = channel_sum_grid(64, c, hw, nhwc);
        EXPECT_LE(g.partials(), kChannelSumTargetBlocks * 32 + c)
            << describe({64, c, hw, nhwc});
      }
    }
  }
}

}  // namespace
}  // namespace vtrain::worker::cuda
