// Which totals a set of devices can add up to, one bit per total: the
// subset-sum table behind the batch split's feasibility checks and its
// threshold search. Totals are in units of the granularity.
#pragma once

#include <cstdint>
#include <vector>

namespace vtrain::balancer::internal {

class ReachableTotals {
 public:
  // The set {0} (nothing assigned yet) over totals 0..limit; larger totals
  // are dropped as they arise.
  explicit ReachableTotals(int64_t limit);

  int64_t limit() const { return limit_; }
  bool contains(int64_t total) const;
  bool empty() const;

  // An empty set over the same range.
  ReachableTotals none() const;

  // Adds to `out` every t + s with t in this set and low <= s <= high, in
  // O(words * log(high - low + 1)): a device that may take any size in a run
  // of consecutive units costs a few shifts, not one per size.
  void add_shifted(int64_t low, int64_t high, ReachableTotals& out) const;

 private:
  ReachableTotals(int64_t limit, bool with_zero);

  std::vector<uint64_t> words_;
  int64_t limit_;
};

}  // namespace vtrain::balancer::internal
