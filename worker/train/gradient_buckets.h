// How the gradient allreduce is cut into buckets that start while backward
// still runs.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/engine/network.h"

namespace vtrain::worker {

// Gradient buckets: consecutive parameter ranges in the order backward
// finishes them (reverse graph order), cut every `bucket_bytes`. Every rank
// derives the same buckets from the same graph, so the allreduce sequences
// match.
struct Bucket {
  int64_t offset = 0;  // floats into the gradient buffer
  int64_t count = 0;
};

struct BucketPlan {
  std::vector<Bucket> buckets;               // in launch order
  std::vector<int> launch_after;             // per param range index: bucket to launch, or -1
};

// The buckets of a network whose parameters lie in `ranges` (graph order),
// each at least `bucket_bytes` (the last one may be smaller).
BucketPlan plan_buckets(const std::vector<ParamRange>& ranges, uint64_t bucket_bytes);

}  // namespace vtrain::worker
