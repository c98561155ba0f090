#include "worker/train/gradient_buckets.h"

#include <algorithm>

namespace vtrain::worker {

BucketPlan plan_buckets(const std::vector<ParamRange>& ranges, uint64_t bucket_bytes) {
  BucketPlan plan;
  plan.launch_after.assign(ranges.size(), -1);
  const int64_t limit = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / sizeof(float)));
  Bucket open;
  for (int i = static_cast<int>(ranges.size()) - 1; i >= 0; --i) {
    // Ranges are laid out in graph order, so walking backwards each one ends
    // where the open bucket begins.
    open.offset = ranges[i].offset;
    open.count += ranges[i].count;
    if (open.count >= limit || i == 0) {
      plan.launch_after[i] = static_cast<int>(plan.buckets.size());
      plan.buckets.push_back(open);
      open = Bucket{};
    }
  }
  return plan;
}

}  // namespace vtrain::worker
