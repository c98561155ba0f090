// How the CUDA backend's per-channel reductions (the bias gradient of a
// half convolution or inner product, the synchronised batch norm's sums)
// share a {n, c, hw} tensor among thread blocks. Plain C++, compiled by
// nvcc for the kernels (cuda_kernels.cu) and by the host compiler for the
// tests, so the arithmetic is checked on machines without a GPU
// (channel_sum_grid_test).
//
// Two passes, deterministic (no atomics): blocks (group, chunk) each sum
// one chunk of the pixels (sample * hw + position) for a group of channels,
// their threads in a fixed tree, into partial[chunk * c + channel]; then one
// thread per channel adds its chunks' partials in chunk order, in double.
// The old one-block-per-channel kernel had 64 blocks for VGG-16's conv1_2
// walk 3.2 million strided pixels each: 6 ms of a 6.2 ms weight gradient on
// an H200.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define VTRAIN_HOST_DEVICE __host__ __device__
#else
#define VTRAIN_HOST_DEVICE
#endif
#if defined(__CUDA_ARCH__)  // the device pass only: the host compiler knows no such pragma
#define VTRAIN_GRID_UNROLL _Pragma("unroll")
#else
#define VTRAIN_GRID_UNROLL
#endif

namespace vtrain::worker::cuda {

inline constexpr int kChannelSumThreads = 256;  // threads per block
// Enough blocks to fill an H100 / H200 (132 SMs, 8 blocks of 256 threads
// each), so the first pass runs at memory speed.
inline constexpr int64_t kChannelSumTargetBlocks = 1024;
// Pixels a thread sums at least, so that small tensors take few blocks.
inline constexpr int64_t kChannelSumMinPixelsPerThread = 8;
// Elements a thread loads before it adds any (its loop is unrolled by
// this much): the loads of a run are all issued before the first store or
// sum, so they are in flight together.
inline constexpr int kChannelSumUnroll = 4;

struct ChannelSumGrid {
  int64_t n = 0, c = 0, hw = 0;
  // NHWC storage, where a pixel's channels are adjacent. {n, c, 1} tensors
  // (an inner product's dy) are stored alike in both layouts: NHWC too.
  bool channels_last = false;
  // Adjacent channels a thread sums per pixel: one 16-byte pack (8 half or
  // 4 float) in NHWC where c is a multiple of it, else 1. One channel a
  // thread read 2 bytes a load: VGG-16 bf16's relu backward with the bias
  // gradient ran at a fifth of an H200's memory speed.
  int vec = 1;
  // A block's threads: lanes_c across channel packs times lanes_p across
  // pixels (NHWC: up to 32 adjacent packs, so a warp reads one run of each
  // pixel; NCHW: all 256 along a channel's contiguous pixels).
  int lanes_c = 1, lanes_p = kChannelSumThreads;
  int64_t groups = 0;        // channel groups, ceil(c / (lanes_c * vec)): the grid's x
  int64_t chunks = 0;        // pixel chunks: the grid's y (at most kChannelSumTargetBlocks)
  int64_t chunk_pixels = 0;  // pixels per chunk (the last may have fewer)
  // At least `chunks`, never smaller for a larger n, and the same whatever
  // vec: what the partial sums are sized for (channel_sum_partial_bytes),
  // so that workspace sized for a micro-batch serves every smaller one and
  // every alignment of its tensors.
  int64_t chunk_bound = 0;

  VTRAIN_HOST_DEVICE int64_t pixels() const { return n * hw; }
  // Partial sums per summed quantity: one per (chunk, channel).
  VTRAIN_HOST_DEVICE int64_t partials() const { return chunks * c; }

  // Calls f(at, count, channel) for the elements thread `thread` of the
  // block of (chunk, group) sums: at[0..count) are the storage indices of
  // up to kChannelSumUnroll of them (count is kChannelSumUnroll but in a
  // thread's last runs), each the first of `vec` adjacent channels from
  // `channel`. Every element of the tensor is visited once over all blocks
  // and threads, each thread's pixels in increasing order.
  template <typename F>
  VTRAIN_HOST_DEVICE void for_each_run(int64_t chunk, int64_t group, int thread, F&& f) const {
    const int64_t ch = (group * lanes_c + thread % lanes_c) * vec;
    if (ch >= c) return;
    const int64_t first = chunk * chunk_pixels + thread / lanes_c;
    const int64_t end = pixels() < (chunk + 1) * chunk_pixels ? pixels()
                                                               : (chunk + 1) * chunk_pixels;
    const int64_t step = lanes_p;
    int64_t at[kChannelSumUnroll];
    int64_t p = first;
    if (channels_last) {
      for (; p + (kChannelSumUnroll - 1) * step < end; p += kChannelSumUnroll * step) {
VTRAIN_GRID_UNROLL
        for (int u = 0; u < kChannelSumUnroll; ++u) at[u] = (p + u * step) * c + ch;
        f(at, kChannelSumUnroll, ch);
      }
      for (; p < end; p += step) {
        at[0] = p * c + ch;
        f(at, 1, ch);
      }
      return;
    }
    // NCHW: pixel p is (sample p / hw, position p % hw), stored at
    // (sample * c + ch) * hw + position; both advance without a division
    // until the position passes the plane's end.
    if (first >= end) return;
    int64_t sample = first / hw, position = first % hw;
    const auto next = [&]() {
      const int64_t here = (sample * c + ch) * hw + position;
      position += step;
      if (position >= hw) {
        sample += position / hw;
        position %= hw;
      }
      return here;
    };
    for (; p + (kChannelSumUnroll - 1) * step < end; p += kChannelSumUnroll * step) {
VTRAIN_GRID_UNROLL
      for (int u = 0; u < kChannelSumUnroll; ++u) at[u] = next();
      f(at, kChannelSumUnroll, ch);
    }
    for (; p < end; p += step) {
      at[0] = next();
      f(at, 1, ch);
    }
  }
};

// The grid for {n, c, hw} with `vec` channels a thread where it fits
// (channels last, c a multiple of vec): about kChannelSumTargetBlocks
// blocks for one channel a thread, fewer where each thread would sum under
// kChannelSumMinPixelsPerThread pixels. The chunks are those of one
// channel a thread whatever vec (a pack's threads take the same pixels
// with fewer, wider blocks), so the partial sums' size is vec's too.
inline ChannelSumGrid channel_sum_grid(int64_t n, int64_t c, int64_t hw, bool channels_last,
                                        int vec = 1) {
  ChannelSumGrid g;
  g.n = n;
  g.c = c;
  g.hw = hw;
  g.channels_last = channels_last || hw == 1;
  const int one_lanes_c = g.channels_last ? 32 : 1;  // one channel a thread
  const int64_t one_groups = (c + one_lanes_c - 1) / one_lanes_c;
  const int64_t pixels = n * hw;
  const int64_t by_blocks =
      (kChannelSumTargetBlocks + one_groups - 1) / std::max<int64_t>(one_groups, 1);
  const int64_t per_chunk_min = kChannelSumThreads / one_lanes_c * kChannelSumMinPixelsPerThread;
  const int64_t by_work = (pixels + per_chunk_min - 1) / per_chunk_min;
  g.chunk_bound = std::max<int64_t>(1, std::min(by_blocks, by_work));
  g.chunk_pixels = std::max<int64_t>(1, (pixels + g.chunk_bound - 1) / g.chunk_bound);
  // Rounding the chunk size up may leave the last chunks empty: drop them.
  g.chunks = std::max<int64_t>(1, (pixels + g.chunk_pixels - 1) / g.chunk_pixels);
  g.vec = g.channels_last && vec > 1 && c % vec == 0 ? vec : 1;
  g.lanes_c = one_lanes_c;
  if (g.vec > 1) {  // a power of two, at least the packs of a pixel, up to 32
    g.lanes_c = 1;
    while (g.lanes_c < 32 && g.lanes_c * g.vec < c) g.lanes_c *= 2;
  }
  g.lanes_p = kChannelSumThreads / g.lanes_c;
  g.groups = (c + g.lanes_c * g.vec - 1) / (g.lanes_c * g.vec);
  return g;
}

// Bytes of the partial sums of `sums` quantities of `accumulator_bytes`
// each (float: the bias gradient; double: batch-norm sums) for {n, c, hw}:
// enough for the grid's partials, and never fewer for a larger n.
inline int64_t channel_sum_partial_bytes(int64_t n, int64_t c, int64_t hw, bool channels_last,
                                         int sums, int accumulator_bytes) {
  return channel_sum_grid(n, c, hw, channels_last).chunk_bound * c * sums * accumulator_bytes;
}

}  // namespace vtrain::worker::cuda
