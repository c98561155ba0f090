// Dynamic storage allocation (DSA) for a recorded trace, after Sekiyama et
// al., "Profile-guided memory optimization for deep neural networks" (Sec. 3):
// given every block's size and lifetime in one step, choose fixed offsets so
// that blocks alive at the same time never share bytes, minimising the peak.
//
// Time is the index of an event in the trace (Sec. 4.1): each allocation
// and each free advances it by one, so a block lives over [start, end).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vtrain::memory {

struct DsaBlock {
  size_t size = 0;    // bytes
  int64_t start = 0;  // time of the allocation
  int64_t end = 0;    // time of the free (> start)
  bool operator==(const DsaBlock&) const = default;
};

// Builds a trace the way Sec. 4.1 profiles one: allocate() returns the
// block's id (its index in the trace), release() ends it; blocks never
// released end at finish().
class DsaTraceRecorder {
 public:
  int allocate(size_t size);
  void release(int id);
  // Ends the blocks still alive; returns the trace.
  std::vector<DsaBlock> finish();

 private:
  std::vector<DsaBlock> blocks_;
  std::vector<bool> open_;
  int64_t now_ = 0;
};

// Two blocks conflict when their lifetimes overlap.
inline bool lifetimes_overlap(const DsaBlock& a, const DsaBlock& b) {
  return a.start < b.end && b.start < a.end;
}

// Throws MemoryError naming the block when a size is 0 or end <= start.
void validate(const std::vector<DsaBlock>& blocks);

// Max over time of the bytes alive at once: no placement can do better.
size_t dsa_lower_bound(const std::vector<DsaBlock>& blocks);

// max(offset + size) of a placement.
size_t dsa_peak(const std::vector<DsaBlock>& blocks, const std::vector<size_t>& offsets);

// The first pair (i, j) of blocks alive at the same time whose byte ranges
// intersect, or nullopt when the placement is valid.
std::optional<std::pair<int, int>> dsa_find_overlap(const std::vector<DsaBlock>& blocks,
                                                    const std::vector<size_t>& offsets);

// What the pool (FreeList best fit, requests placed as they come, frees
// before allocations at the same time) spans on the trace: the baseline a
// static plan is measured against.
size_t dsa_pool_span(const std::vector<DsaBlock>& blocks);

// The best-fit heuristic of Sec. 3.2 (after Burke et al.): keep a skyline of
// offset lines over time; take the lowest (leftmost on ties); place there
// the unplaced block with the longest lifetime that lies within the line's
// time span; if none does, lift the line to its lower neighbour and merge.
// Quadratic in the number of blocks. Returns one offset per block.
std::vector<size_t> dsa_best_fit(const std::vector<DsaBlock>& blocks);

// A best-fit plan of a trace: its offsets, the bytes it spans, and how long
// the heuristic took.
struct DsaPlan {
  std::vector<size_t> offsets;
  size_t peak = 0;
  double seconds = 0;
};
DsaPlan dsa_plan(const std::vector<DsaBlock>& blocks);

// Places the blocks one by one in `order`, each at the lowest offset where it
// meets none of the already placed blocks alive at the same time. Some order
// gives an optimal placement (the order of any optimal one's offsets), so
// this is also the brute force that tests enumerate.
std::vector<size_t> dsa_place_in_order(const std::vector<DsaBlock>& blocks,
                                       const std::vector<int>& order);

struct DsaMipOptions {
  std::chrono::milliseconds time_limit{0};  // 0 = none; hitting it throws
};

struct DsaMipResult {
  size_t peak = 0;
  std::vector<size_t> offsets;
};

// The exact MIP of Sec. 3.1 solved with GLPK: min u s.t. x_i + w_i <= u and,
// for every pair alive at once, one above the other (big-M = the best-fit
// peak, which also bounds u). For small traces (about 30 blocks); throws
// balancer::BalancerError on a solver failure or the time limit.
DsaMipResult dsa_solve_mip(const std::vector<DsaBlock>& blocks, const DsaMipOptions& options = {});

}  // namespace vtrain::memory
