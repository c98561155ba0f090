#include "memory/dsa.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "balancer/lp_model.h"
#include "memory/free_list.h"
#include "memory/memory_error.h"

namespace vtrain::memory {

// ------------------------------------------------------------ the trace

int DsaTraceRecorder::allocate(size_t size) {
  blocks_.push_back({size, now_++, 0});
  open_.push_back(true);
  return static_cast<int>(blocks_.size()) - 1;
}

void DsaTraceRecorder::release(int id) {
  if (id < 0 || id >= static_cast<int>(blocks_.size()) || !open_[id]) {
    throw MemoryError("DSA trace: release of block " + std::to_string(id) +
                      ", which is not allocated");
  }
  blocks_[id].end = now_++;
  open_[id] = false;
}

std::vector<DsaBlock> DsaTraceRecorder::finish() {
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (open_[i]) blocks_[i].end = now_;
  }
  if (std::any_of(open_.begin(), open_.end(), [](bool o) { return o; })) ++now_;
  std::fill(open_.begin(), open_.end(), false);
  return blocks_;
}

// ----------------------------------------------------------- measures

void validate(const std::vector<DsaBlock>& blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const DsaBlock& b = blocks[i];
    if (b.size == 0 || b.end <= b.start) {
      throw MemoryError("DSA block " + std::to_string(i) + ": size " + std::to_string(b.size) +
                        ", lifetime [" + std::to_string(b.start) + ", " + std::to_string(b.end) +
                        ") (need size > 0 and end > start)");
    }
  }
}

size_t dsa_pool_span(const std::vector<DsaBlock>& blocks) {
  struct Event {
    int64_t time;
    bool alloc;
    int id;
  };
  std::vector<Event> events;
  for (int i = 0; i < static_cast<int>(blocks.size()); ++i) {
    events.push_back({blocks[i].start, true, i});
    events.push_back({blocks[i].end, false, i});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : (!a.alloc && b.alloc);
  });
  FreeList pool(size_t{1} << 50);
  std::vector<size_t> at(blocks.size());
  for (const Event& e : events) {
    if (e.alloc) {
      at[e.id] = *pool.allocate(blocks[e.id].size);
    } else {
      pool.release(at[e.id]);
    }
  }
  return pool.high_water();
}

size_t dsa_lower_bound(const std::vector<DsaBlock>& blocks) {
  // Sweep the allocation and free times; at equal times frees come first
  // because lifetimes are half-open.
  std::vector<std::pair<int64_t, int64_t>> events;
  events.reserve(2 * blocks.size());
  for (const DsaBlock& b : blocks) {
    events.push_back({b.start, static_cast<int64_t>(b.size)});
    events.push_back({b.end, -static_cast<int64_t>(b.size)});
  }
  std::sort(events.begin(), events.end());
  int64_t live = 0, best = 0;
  for (const auto& [t, delta] : events) {
    live += delta;
    best = std::max(best, live);
  }
  return static_cast<size_t>(best);
}

size_t dsa_peak(const std::vector<DsaBlock>& blocks, const std::vector<size_t>& offsets) {
  size_t peak = 0;
  for (size_t i = 0; i < blocks.size(); ++i) peak = std::max(peak, offsets[i] + blocks[i].size);
  return peak;
}

std::optional<std::pair<int, int>> dsa_find_overlap(const std::vector<DsaBlock>& blocks,
                                                    const std::vector<size_t>& offsets) {
  if (offsets.size() != blocks.size()) {
    throw MemoryError("DSA placement: " + std::to_string(offsets.size()) + " offsets for " +
                      std::to_string(blocks.size()) + " blocks");
  }
  // Sweep over start times; compare each block with the ones still alive.
  std::vector<int> order(blocks.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return blocks[a].start < blocks[b].start; });
  std::vector<int> alive;
  for (int i : order) {
    std::erase_if(alive, [&](int j) { return blocks[j].end <= blocks[i].start; });
    for (int j : alive) {
      if (offsets[i] < offsets[j] + blocks[j].size && offsets[j] < offsets[i] + blocks[i].size) {
        return std::make_pair(std::min(i, j), std::max(i, j));
      }
    }
    alive.push_back(i);
  }
  return std::nullopt;
}

// ------------------------------------------------------------ best fit

namespace {

struct Segment {  // one offset line of the skyline
  int64_t t0, t1;
  size_t height;
};

}  // namespace

DsaPlan dsa_plan(const std::vector<DsaBlock>& blocks) {
  const auto start = std::chrono::steady_clock::now();
  DsaPlan plan;
  plan.offsets = dsa_best_fit(blocks);
  plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  plan.peak = dsa_peak(blocks, plan.offsets);
  return plan;
}

std::vector<size_t> dsa_best_fit(const std::vector<DsaBlock>& blocks) {
  validate(blocks);
  std::vector<size_t> offsets(blocks.size(), 0);
  if (blocks.empty()) return offsets;
  int64_t t_min = blocks[0].start, t_max = blocks[0].end;
  for (const DsaBlock& b : blocks) {
    t_min = std::min(t_min, b.start);
    t_max = std::max(t_max, b.end);
  }
  // Candidates by decreasing lifetime (then size, then id, for determinism).
  std::vector<int> unplaced(blocks.size());
  std::iota(unplaced.begin(), unplaced.end(), 0);
  std::sort(unplaced.begin(), unplaced.end(), [&](int a, int b) {
    const int64_t la = blocks[a].end - blocks[a].start, lb = blocks[b].end - blocks[b].start;
    if (la != lb) return la > lb;
    if (blocks[a].size != blocks[b].size) return blocks[a].size > blocks[b].size;
    return a < b;
  });
  std::vector<Segment> sky = {{t_min, t_max, 0}};
  size_t placed = 0;
  std::vector<bool> done(blocks.size(), false);
  while (placed < blocks.size()) {
    // The lowest offset line, leftmost on ties.
    size_t s = 0;
    for (size_t k = 1; k < sky.size(); ++k) {
      if (sky[k].height < sky[s].height) s = k;
    }
    const Segment seg = sky[s];
    int pick = -1;
    for (int id : unplaced) {
      if (!done[id] && blocks[id].start >= seg.t0 && blocks[id].end <= seg.t1) {
        pick = id;
        break;
      }
    }
    if (pick >= 0) {
      const DsaBlock& b = blocks[pick];
      offsets[pick] = seg.height;
      done[pick] = true;
      ++placed;
      std::vector<Segment> parts;
      if (b.start > seg.t0) parts.push_back({seg.t0, b.start, seg.height});
      parts.push_back({b.start, b.end, seg.height + b.size});
      if (b.end < seg.t1) parts.push_back({b.end, seg.t1, seg.height});
      sky.erase(sky.begin() + s);
      sky.insert(sky.begin() + s, parts.begin(), parts.end());
      // Compact the candidate list now and then.
      if (placed % 64 == 0) std::erase_if(unplaced, [&](int id) { return done[id]; });
    } else {
      // Nothing fits on this line: lift it to its lower neighbour and merge
      // (with both neighbours when they are equally high).
      const bool has_left = s > 0, has_right = s + 1 < sky.size();
      if (!has_left && !has_right) {
        throw MemoryError("DSA best fit: internal error, no block fits the whole time span");
      }
      size_t h = SIZE_MAX;
      if (has_left) h = std::min(h, sky[s - 1].height);
      if (has_right) h = std::min(h, sky[s + 1].height);
      sky[s].height = h;
    }
    // Merge neighbouring lines of equal height.
    std::vector<Segment> merged;
    merged.reserve(sky.size());
    for (const Segment& g : sky) {
      if (!merged.empty() && merged.back().height == g.height) {
        merged.back().t1 = g.t1;
      } else {
        merged.push_back(g);
      }
    }
    sky.swap(merged);
  }
  return offsets;
}

std::vector<size_t> dsa_place_in_order(const std::vector<DsaBlock>& blocks,
                                       const std::vector<int>& order) {
  std::vector<size_t> offsets(blocks.size(), 0);
  std::vector<int> placed;
  placed.reserve(order.size());
  std::vector<std::pair<size_t, size_t>> taken;  // byte ranges of conflicting placed blocks
  for (int i : order) {
    taken.clear();
    for (int j : placed) {
      if (lifetimes_overlap(blocks[i], blocks[j])) {
        taken.push_back({offsets[j], offsets[j] + blocks[j].size});
      }
    }
    std::sort(taken.begin(), taken.end());
    size_t x = 0;
    for (const auto& [lo, hi] : taken) {
      if (lo >= x + blocks[i].size) break;  // the gap below this range holds the block
      x = std::max(x, hi);
    }
    offsets[i] = x;
    placed.push_back(i);
  }
  return offsets;
}

// ----------------------------------------------------------------- MIP

DsaMipResult dsa_solve_mip(const std::vector<DsaBlock>& blocks, const DsaMipOptions& options) {
  validate(blocks);
  DsaMipResult result;
  if (blocks.empty()) return result;
  const std::vector<size_t> heuristic = dsa_best_fit(blocks);
  const size_t upper = dsa_peak(blocks, heuristic);
  const size_t lower = dsa_lower_bound(blocks);
  // Work in units of the sizes' gcd, so GLPK sees small integers.
  size_t unit = 0;
  for (const DsaBlock& b : blocks) unit = std::gcd(unit, b.size);
  const double m = static_cast<double>(upper / unit);

  balancer::LpModel lp("dsa");
  const int u = lp.add_continuous(static_cast<double>(lower / unit), m, 1.0);
  std::vector<int> x(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    x[i] = lp.add_continuous(0.0, m - static_cast<double>(blocks[i].size / unit), 0.0);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const double wi = static_cast<double>(blocks[i].size / unit);
    const balancer::Term top[] = {{x[i], 1.0}, {u, -1.0}};
    lp.add_row("peak_" + std::to_string(i), balancer::RowSense::kLessEqual, -wi, top);
    for (size_t j = i + 1; j < blocks.size(); ++j) {
      if (!lifetimes_overlap(blocks[i], blocks[j])) continue;
      const double wj = static_cast<double>(blocks[j].size / unit);
      const int z = lp.add_binary(0.0);  // 0: i below j; 1: j below i
      const balancer::Term below[] = {{x[i], 1.0}, {x[j], -1.0}, {z, -m}};
      lp.add_row("below_" + std::to_string(i) + "_" + std::to_string(j),
                 balancer::RowSense::kLessEqual, -wi, below);
      const balancer::Term above[] = {{x[j], 1.0}, {x[i], -1.0}, {z, m}};
      lp.add_row("above_" + std::to_string(i) + "_" + std::to_string(j),
                 balancer::RowSense::kLessEqual, m - wj, above);
    }
  }
  const balancer::MipSolution solution =
      lp.solve("DSA MIP: no placement within the best-fit peak (cannot happen)",
               {.time_limit = options.time_limit});
  // Re-place in the order of the MIP's offsets at the lowest free offset:
  // exact integers, never higher than the MIP's own offsets.
  std::vector<int> order(blocks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return solution.values[x[a]] < solution.values[x[b]];
  });
  result.offsets = dsa_place_in_order(blocks, order);
  result.peak = dsa_peak(blocks, result.offsets);
  return result;
}

}  // namespace vtrain::memory
