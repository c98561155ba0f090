// Dropout's draws, plain C++ that every backend compiles: the host (the CPU
// backend, the engine's dropout_mask.h and the tests) and nvcc, where each
// function is __host__ __device__, so a CUDA thread computes an element's
// draw exactly as the host does (the tests check the host's; the CUDA
// kernel runs this code).
//
// A mask is a pure function of (seed, step, layer, global sample index,
// element): the draws are counter-based. The key's hash is the layer's
// stream (dropout_layer_stream), the sample's stream is chained from it
// (dropout_sample_stream), and element e's draw is the e-th draw of the
// splitmix64 generator started at that stream (dropout_draw), computed
// without the e - 1 before it. An element is the sample's element in
// logical C x H x W order, whatever the tensor's layout, so devices that
// store activations in other layouts draw the same mask.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define VTRAIN_DRAW_FN __host__ __device__ __forceinline__
#else
#define VTRAIN_DRAW_FN inline
#endif

namespace vtrain::worker {

// What a mask depends on besides the sample.
struct DropoutKey {
  uint64_t seed = 0;  // the run's seed (train.seed)
  int64_t step = 0;   // the optimizer step the forward belongs to
  int layer = 0;      // the layer's index in the graph
};

// splitmix64's increment: a step of the generator adds it to the state.
inline constexpr uint64_t kSplitmix64Increment = 0x9e3779b97f4a7c15ULL;

// One step of splitmix64: advances `state` and returns its draw (the
// generator of initial weights, rng.h, is this).
VTRAIN_DRAW_FN uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += kSplitmix64Increment);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The first draw of a generator started at `seed`.
VTRAIN_DRAW_FN uint64_t splitmix64_first(uint64_t seed) { return splitmix64(seed); }

// A hash of (h, value) in which the two do not commute: h is mixed before
// value is added.
VTRAIN_DRAW_FN uint64_t dropout_chain(uint64_t h, uint64_t value) {
  return splitmix64_first(splitmix64_first(h) + value);
}

// The key's stream: (seed, step, layer) hashed once per call, on the host.
VTRAIN_DRAW_FN uint64_t dropout_layer_stream(const DropoutKey& key) {
  return dropout_chain(dropout_chain(key.seed, static_cast<uint64_t>(key.step)),
                       static_cast<uint64_t>(key.layer));
}

// The stream of `sample` (its index in the global batch of the step) under
// a layer stream.
VTRAIN_DRAW_FN uint64_t dropout_sample_stream(uint64_t layer_stream, int64_t sample) {
  return dropout_chain(layer_stream, static_cast<uint64_t>(sample));
}

// The same from the key.
VTRAIN_DRAW_FN uint64_t dropout_stream(const DropoutKey& key, int64_t sample) {
  return dropout_sample_stream(dropout_layer_stream(key), sample);
}

// The 64-bit draw of element `element` of a sample's stream: the state a
// generator started at `stream` reaches after element + 1 steps, drawn.
VTRAIN_DRAW_FN uint64_t dropout_draw(uint64_t stream, int64_t element) {
  return splitmix64_first(stream + static_cast<uint64_t>(element) * kSplitmix64Increment);
}

// The draws' threshold for dropping with probability p in [0, 1): p * 2^32,
// exact in double (a float times a power of two), below 2^32.
VTRAIN_DRAW_FN uint32_t dropout_threshold(float p) {
  return static_cast<uint32_t>(static_cast<double>(p) * 4294967296.0);
}

// Whether a draw keeps its element: its top 32 bits against the threshold.
VTRAIN_DRAW_FN bool dropout_kept(uint64_t draw, uint32_t threshold) {
  return (draw >> 32) >= threshold;
}

// The same from p.
VTRAIN_DRAW_FN bool dropout_keeps(uint64_t draw, float p) {
  return dropout_kept(draw, dropout_threshold(p));
}

// The factor kept elements are multiplied by (inverted dropout, as
// PyTorch): 1 / (1 - p), so the expected output is the input.
VTRAIN_DRAW_FN float dropout_scale(float p) { return 1.0f / (1.0f - p); }

// Element `element` of a sample after dropout: x * scale where it is kept,
// else 0 (whatever x: a dropped NaN does not pass, as in the reference).
VTRAIN_DRAW_FN float dropout_value(float x, uint64_t sample_stream, int64_t element,
                                       uint32_t threshold, float scale) {
  return dropout_kept(dropout_draw(sample_stream, element), threshold) ? x * scale : 0.0f;
}

}  // namespace vtrain::worker
