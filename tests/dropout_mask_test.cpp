// Dropout's mask: a function of (seed, step, global sample index, layer)
// only, the kept fraction 1 - p, the draws counter-based.
#include "worker/engine/dropout_mask.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "worker/engine/rng.h"

namespace vtrain::worker {
namespace {

using Mask = std::vector<uint8_t>;

Mask mask(const DropoutKey& key, float p, int64_t first, int64_t samples, int64_t per_sample) {
  Mask keep(static_cast<size_t>(samples * per_sample), 2);
  dropout_mask(key, p, first, samples, per_sample, keep.data());
  return keep;
}

constexpr int64_t kPerSample = 3 * 5 * 5;
const DropoutKey kKey{42, 17, 3};

TEST(DropoutMask, ASampleHasItsMaskWhereverItsRankStartsInTheBatch) {
  const Mask whole = mask(kKey, 0.5f, 0, 64, kPerSample);
  // The uneven split: 7, 13 and 44 samples on three ranks.
  Mask split;
  int64_t first = 0;
  for (int64_t share : {7, 13, 44}) {
    const Mask part = mask(kKey, 0.5f, first, share, kPerSample);
    split.insert(split.end(), part.begin(), part.end());
    first += share;
  }
  EXPECT_EQ(split, whole);
  // One sample alone, as a recomputation of a micro-batch of one would ask.
  const Mask one = mask(kKey, 0.5f, 20, 1, kPerSample);
  EXPECT_EQ(one, Mask(whole.begin() + 20 * kPerSample, whole.begin() + 21 * kPerSample));
}

TEST(DropoutMask, SameArgumentsSameMaskAcrossCalls) {
  // A resume or a recomputation calls again with the same (seed, step, layer).
  EXPECT_EQ(mask(kKey, 0.3f, 5, 9, kPerSample), mask(kKey, 0.3f, 5, 9, kPerSample));
}

TEST(DropoutMask, EveryKeyPartChangesTheMask) {
  const Mask base = mask(kKey, 0.5f, 0, 8, kPerSample);
  EXPECT_NE(mask({43, 17, 3}, 0.5f, 0, 8, kPerSample), base);
  EXPECT_NE(mask({42, 18, 3}, 0.5f, 0, 8, kPerSample), base);
  EXPECT_NE(mask({42, 17, 4}, 0.5f, 0, 8, kPerSample), base);
  // Different samples of one step get different masks.
  const Mask two = mask(kKey, 0.5f, 0, 2, kPerSample);
  EXPECT_NE(Mask(two.begin(), two.begin() + kPerSample), Mask(two.begin() + kPerSample, two.end()));
  // step and layer do not stand in for each other.
  EXPECT_NE(mask({42, 3, 17}, 0.5f, 0, 8, kPerSample), base);
}

TEST(DropoutMask, KeepsOneMinusPOfTheElements) {
  constexpr int64_t kSamples = 64, kElements = 4096;
  for (float p : {0.1f, 0.2f, 0.5f, 0.9f}) {
    SCOPED_TRACE(p);
    const Mask keep = mask(kKey, p, 0, kSamples, kElements);
    int64_t kept = 0;
    for (uint8_t k : keep) {
      ASSERT_LE(k, 1);
      kept += k;
    }
    const double n = static_cast<double>(keep.size());
    // Five standard deviations of a binomial count: a fixed key, so this
    // either always passes or never does.
    const double sigma = std::sqrt(n * p * (1.0 - p));
    EXPECT_NEAR(static_cast<double>(kept), n * (1.0 - p), 5 * sigma);
  }
}

TEST(DropoutMask, PZeroKeepsEverything) {
  const Mask keep = mask(kKey, 0.0f, 0, 4, kPerSample);
  EXPECT_EQ(keep, Mask(keep.size(), 1));
}

TEST(DropoutMask, ThresholdOnTheTopBits) {
  EXPECT_TRUE(dropout_keeps(uint64_t{1} << 63, 0.5f));
  EXPECT_FALSE(dropout_keeps((uint64_t{1} << 63) - 1, 0.5f));
  EXPECT_TRUE(dropout_keeps(~uint64_t{0}, 0.999f));
  EXPECT_FALSE(dropout_keeps(0, 0.001f));
}

TEST(DropoutMask, DrawsAreTheGeneratorsSequenceFromTheStream) {
  // What lets a kernel compute element e alone: it is draw e + 1 of Rng(stream).
  const uint64_t stream = dropout_stream(kKey, 11);
  Rng rng(stream);
  for (int64_t e = 0; e < 100; ++e) EXPECT_EQ(dropout_draw(stream, e), rng.next()) << e;
}

TEST(DropoutMask, ScaleIsInverted) {
  EXPECT_FLOAT_EQ(dropout_scale(0.0f), 1.0f);
  EXPECT_FLOAT_EQ(dropout_scale(0.2f), 1.25f);
  EXPECT_FLOAT_EQ(dropout_scale(0.5f), 2.0f);
}

}  // namespace
}  // namespace vtrain::worker
