// Exact multiple-choice knapsack (minimise time, weight <= capacity), the
// classic way: LP relaxation, reduced-cost fixing, then a dynamic programme
// over the groups whose states are Pareto sets of partial selections, each
// cut by the LP bound of the groups still to decide.
//
// Why not hand the ILP to GLPK: with measured (noisy, all distinct) times,
// near-optimal selections differ by hundredths of a millisecond, and GLPK's
// branch and bound keeps tens of thousands of open nodes on a
// ResNet-152-sized instance without closing the gap in minutes. The bounded
// DP only ever keeps partial selections that can still reach a target time.
//
// The bound. With lambda >= 0 any multiplier for the capacity row,
//   L(lambda) = sum_k min_c (T_kc + lambda W_kc) - lambda * capacity
// is a lower bound on every feasible selection (Lagrangian relaxation), and
// a selection's time is L(lambda) plus its items' reduced costs
// r_kc = T_kc + lambda W_kc - min_c' (T_kc' + lambda W_kc') plus lambda times
// the capacity it leaves unused. Taking lambda as the LP dual (from the
// greedy below), an item with L + r_kc above a target time can be in no
// selection reaching the target. A partial selection is dropped when its
// time plus the LP optimum of the remaining groups (with the capacity it
// leaves them) exceeds the target.

#include "balancer/internal/choice_knapsack.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace vtrain::balancer::internal {
namespace {

using Groups = std::span<const std::vector<KnapsackItem>>;
// Per group, the indices of its items still in play, ascending; one flat
// array, because the search copies and filters it several times per solve.
class Alive {
 public:
  void push(size_t item) { items_.push_back(item); }
  void end_group() { start_.push_back(items_.size()); }  // after the group's items are pushed
  std::span<const size_t> operator[](size_t k) const { return {items_.data() + start_[k], start_[k + 1] - start_[k]}; }

 private:
  std::vector<size_t> items_;
  std::vector<size_t> start_ = {0};  // group k: items_[start_[k], start_[k + 1])
};

struct Relaxation {
  double lambda = 0;           // time per unit of weight: the LP dual of the capacity row
  std::vector<size_t> choice;  // per group: the LP optimum's integral part
  uint64_t weight = 0;         // weight of `choice`
};

// The vertices of the lower convex hull of a group's live items in
// (weight, time): the only items an LP optimum uses.
std::vector<size_t> convex_hull(const std::vector<KnapsackItem>& items, std::span<const size_t> alive) {
  std::vector<size_t> hull;
  for (size_t c : alive) {
    while (hull.size() >= 2) {
      const KnapsackItem& a = items[hull[hull.size() - 2]];
      const KnapsackItem& b = items[hull.back()];
      const KnapsackItem& p = items[c];
      // b is no vertex when the time saved per weight from a to b is no
      // more than from b to p.
      const double saved_ab = a.time - b.time, saved_bp = b.time - p.time;
      const auto weight_ab = static_cast<double>(b.weight - a.weight);
      const auto weight_bp = static_cast<double>(p.weight - b.weight);
      if (saved_ab * weight_bp > saved_bp * weight_ab) break;
      hull.pop_back();
    }
    hull.push_back(c);
  }
  return hull;
}

// The LP relaxation by the greedy: every group starts at its lightest item;
// hull steps are taken in order of time saved per weight while they fit; the
// first that does not fit would be taken fractionally, and its saving per
// weight is the dual lambda.
Relaxation relax(Groups groups, const Alive& alive, uint64_t capacity) {
  struct Step {
    double saving_per_weight;
    size_t group, to;
  };
  Relaxation relaxation;
  std::vector<Step> steps;
  for (size_t k = 0; k < groups.size(); ++k) {
    const std::vector<size_t> hull = convex_hull(groups[k], alive[k]);
    relaxation.choice.push_back(hull.front());
    relaxation.weight += groups[k][hull.front()].weight;
    for (size_t i = 1; i < hull.size(); ++i) {
      const KnapsackItem& from = groups[k][hull[i - 1]];
      const KnapsackItem& to = groups[k][hull[i]];
      steps.push_back({(from.time - to.time) / static_cast<double>(to.weight - from.weight), k, hull[i]});
    }
  }
  // A group's hull savings per weight decrease along the hull, so a stable
  // sort keeps each group's steps in hull order.
  std::stable_sort(steps.begin(), steps.end(),
                   [](const Step& a, const Step& b) { return a.saving_per_weight > b.saving_per_weight; });
  for (const Step& step : steps) {
    const uint64_t extra = groups[step.group][step.to].weight - groups[step.group][relaxation.choice[step.group]].weight;
    if (extra > capacity - relaxation.weight) {
      relaxation.lambda = step.saving_per_weight;
      break;
    }
    relaxation.choice[step.group] = step.to;
    relaxation.weight += extra;
  }
  return relaxation;
}

// Spends what the LP's integral part left of the capacity: repeatedly the
// single change of one group's item that saves the most time and fits.
void fill_greedily(Groups groups, const Alive& alive, uint64_t capacity, std::vector<size_t>& choice,
                   uint64_t weight) {
  for (;;) {
    const uint64_t left = capacity - weight;
    double best_saving = 0;
    size_t best_group = 0, best_item = 0;
    for (size_t k = 0; k < groups.size(); ++k) {
      const KnapsackItem& current = groups[k][choice[k]];
      for (size_t c : alive[k]) {
        const KnapsackItem& other = groups[k][c];
        if (other.weight > current.weight && other.weight - current.weight > left) break;
        if (current.time - other.time > best_saving) {
          best_saving = current.time - other.time;
          best_group = k;
          best_item = c;
        }
      }
    }
    if (best_saving <= 0) return;
    weight = weight - groups[best_group][choice[best_group]].weight + groups[best_group][best_item].weight;
    choice[best_group] = best_item;
  }
}

double total_time(Groups groups, const std::vector<size_t>& choice) {
  double total = 0;
  for (size_t k = 0; k < groups.size(); ++k) total += groups[k][choice[k]].time;
  return total;
}

// The LP relaxation of a set of groups as a function of the capacity left
// for them: a lower bound on the time of any selection from them.
class LpBound {
 public:
  LpBound() = default;

  // This set plus one more group, with its live items' convex hull.
  LpBound with(const std::vector<KnapsackItem>& items, const std::vector<size_t>& hull) const {
    LpBound out;
    out.base_weight_ = base_weight_ + items[hull.front()].weight;
    out.base_time_ = base_time_ + items[hull.front()].time;
    std::vector<Step> added;
    for (size_t i = 1; i < hull.size(); ++i) {
      const KnapsackItem& from = items[hull[i - 1]];
      const KnapsackItem& to = items[hull[i]];
      const uint64_t weight = to.weight - from.weight;
      added.push_back({(from.time - to.time) / static_cast<double>(weight), weight, from.time - to.time});
    }
    out.steps_.resize(steps_.size() + added.size());
    std::merge(steps_.begin(), steps_.end(), added.begin(), added.end(), out.steps_.begin(),
               [](const Step& a, const Step& b) { return a.saving_per_weight > b.saving_per_weight; });
    uint64_t weight = 0;
    double saving = 0;
    for (Step& step : out.steps_) {
      weight += step.weight;
      saving += step.saving;
      out.total_weight_.push_back(weight);
      out.total_saving_.push_back(saving);
    }
    return out;
  }

  uint64_t least_weight() const { return base_weight_; }

  // The LP optimum with `capacity`; infinity when even the lightest items
  // do not fit.
  double at(uint64_t capacity) const {
    if (capacity < base_weight_) return std::numeric_limits<double>::infinity();
    const uint64_t left = capacity - base_weight_;
    // Steps taken whole: those whose running total weight fits.
    const size_t whole = static_cast<size_t>(
        std::upper_bound(total_weight_.begin(), total_weight_.end(), left) - total_weight_.begin());
    double saving = whole > 0 ? total_saving_[whole - 1] : 0.0;
    if (whole < steps_.size()) {
      const uint64_t used = whole > 0 ? total_weight_[whole - 1] : 0;
      saving += static_cast<double>(left - used) * steps_[whole].saving_per_weight;
    }
    return base_time_ - saving;
  }

 private:
  struct Step {
    double saving_per_weight;
    uint64_t weight;
    double saving;
  };

  uint64_t base_weight_ = 0;  // the lightest items together
  double base_time_ = 0;      // their time
  std::vector<Step> steps_;   // every group's hull steps, best saving per weight first
  std::vector<uint64_t> total_weight_;  // per step: weight of it and all before
  std::vector<double> total_saving_;    // per step: saving of it and all before
};

// A partial selection over the first groups of the DP order.
struct State {
  uint64_t weight;
  double time;
  uint32_t parent;  // index into the previous layer
  uint32_t item;    // this group's item
};

// The groups in `order`, one layer each. Layer i holds the Pareto set of
// selections from the first i groups (weight ascending, time strictly
// falling) that can still reach the time limit: a state is dropped when its
// time plus the LP bound of the remaining groups, with the capacity it
// leaves them, exceeds the limit.
class BoundedDp {
 public:
  BoundedDp(Groups groups, const Alive& alive, std::vector<size_t> order, uint64_t capacity, double limit)
      : groups_(groups), alive_(alive), order_(std::move(order)), capacity_(capacity), limit_(limit) {
    rest_.resize(order_.size() + 1);
    for (size_t i = order_.size(); i-- > 0;) {
      const size_t k = order_[i];
      rest_[i] = rest_[i + 1].with(groups_[k], convex_hull(groups_[k], alive_[k]));
    }
  }

  // Per group in `order`, the chosen item of the fastest selection that
  // fits; nullopt when none is within the limit.
  std::optional<std::vector<size_t>> solve() {
    layers_.assign(1, {State{0, 0.0, 0, 0}});
    for (size_t i = 0; i < order_.size(); ++i) {
      extend(i);
      if (layers_.back().empty()) return std::nullopt;
    }
    // The last state of a Pareto layer is its fastest.
    std::vector<size_t> items(order_.size());
    uint32_t state = static_cast<uint32_t>(layers_.back().size() - 1);
    for (size_t i = order_.size(); i-- > 0;) {
      const State& s = layers_[i + 1][state];
      items[i] = s.item;
      state = s.parent;
    }
    return items;
  }

 private:
  void extend(size_t i) {
    const size_t k = order_[i];
    const std::vector<State>& from = layers_.back();
    std::vector<State> next;
    next.reserve(from.size() * alive_[k].size());
    for (size_t c : alive_[k]) {
      const KnapsackItem& item = groups_[k][c];
      for (uint32_t s = 0; s < from.size(); ++s) {
        next.push_back({from[s].weight + item.weight, from[s].time + item.time, s, static_cast<uint32_t>(c)});
      }
    }
    std::sort(next.begin(), next.end(), [](const State& a, const State& b) {
      return a.weight != b.weight ? a.weight < b.weight : a.time < b.time;
    });
    const LpBound& rest = rest_[i + 1];
    size_t kept = 0;
    double fastest = std::numeric_limits<double>::infinity();
    for (const State& state : next) {
      if (state.weight > capacity_ - rest.least_weight()) break;  // the rest cannot fit
      if (state.time >= fastest) continue;                        // dominated
      fastest = state.time;
      if (state.time + rest.at(capacity_ - state.weight) > limit_) continue;
      next[kept++] = state;
    }
    next.resize(kept);
    layers_.push_back(std::move(next));
  }

  Groups groups_;
  const Alive& alive_;
  std::vector<size_t> order_;
  uint64_t capacity_;
  double limit_;               // no selection slower than this is wanted
  std::vector<LpBound> rest_;  // per position: the groups from there on
  std::vector<std::vector<State>> layers_;
};

// L(lambda): a lower bound on every feasible selection's time.
double lagrangian_bound(Groups groups, const Alive& alive, uint64_t capacity, double lambda) {
  double bound = -lambda * static_cast<double>(capacity);
  for (size_t k = 0; k < groups.size(); ++k) {
    double cheapest = std::numeric_limits<double>::infinity();
    for (size_t c : alive[k]) {
      cheapest = std::min(cheapest, groups[k][c].time + lambda * static_cast<double>(groups[k][c].weight));
    }
    bound += cheapest;
  }
  return bound;
}

// The fastest selection whose time is at most `target` (plus a margin
// against rounding); nullopt when there is none. Items whose Lagrangian
// bound exceeds the target are dropped first (reduced-cost fixing), groups
// left with one item are fixed, and the bounded DP searches the rest.
std::optional<std::vector<size_t>> fastest_within(Groups groups, const Alive& candidates, uint64_t capacity,
                                                  double lambda, double target) {
  const double limit = target + 1e-9 * std::max(1.0, std::abs(target));
  const double bound = lagrangian_bound(groups, candidates, capacity, lambda);
  Alive alive;
  std::vector<size_t> choice(groups.size()), open;
  uint64_t fixed_weight = 0;
  double fixed_time = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    auto priced = [&](size_t c) { return groups[k][c].time + lambda * static_cast<double>(groups[k][c].weight); };
    double cheapest = std::numeric_limits<double>::infinity();
    for (size_t c : candidates[k]) cheapest = std::min(cheapest, priced(c));
    for (size_t c : candidates[k]) {
      if (bound + (priced(c) - cheapest) <= limit) alive.push(c);
    }
    alive.end_group();
    if (alive[k].empty()) return std::nullopt;
    if (alive[k].size() > 1) {
      open.push_back(k);
      continue;
    }
    choice[k] = alive[k].front();
    fixed_weight += groups[k][choice[k]].weight;
    fixed_time += groups[k][choice[k]].time;
    if (fixed_weight > capacity) return std::nullopt;
  }
  if (open.empty()) return fixed_time <= limit ? std::optional(choice) : std::nullopt;

  // Groups with the most weight at stake first: once they are decided the
  // LP bound of the rest is tight and prunes most states (on the
  // ResNet-152 bench instance ten times fewer than in kernel order).
  auto spread = [&](size_t k) { return groups[k][alive[k].back()].weight - groups[k][alive[k].front()].weight; };
  std::stable_sort(open.begin(), open.end(), [&](size_t a, size_t b) { return spread(a) > spread(b); });
  BoundedDp dp(groups, alive, open, capacity - fixed_weight, limit - fixed_time);
  const std::optional<std::vector<size_t>> items = dp.solve();
  if (!items) return std::nullopt;
  for (size_t i = 0; i < open.size(); ++i) choice[open[i]] = (*items)[i];
  return choice;
}

}  // namespace

std::optional<std::vector<size_t>> solve_choice_knapsack(Groups groups, uint64_t capacity) {
  // No workspace comes near 2^62 bytes; below it, sums of two weights that
  // each fit cannot overflow.
  capacity = std::min(capacity, uint64_t{1} << 62);
  // Sums stop growing past the capacity, so they cannot overflow either.
  uint64_t lightest = 0, heaviest = 0;
  for (const std::vector<KnapsackItem>& items : groups) {
    if (items.front().weight > capacity - lightest) return std::nullopt;
    lightest += items.front().weight;
    heaviest = items.back().weight > capacity - std::min(capacity, heaviest) ? capacity + 1
                                                                              : heaviest + items.back().weight;
  }
  std::vector<size_t> choice(groups.size());
  if (heaviest <= capacity) {  // every group's fastest item fits: optimal
    for (size_t k = 0; k < groups.size(); ++k) choice[k] = groups[k].size() - 1;
    return choice;
  }

  // An item heavier than the capacity minus every other group's lightest
  // is in no feasible selection.
  Alive alive;
  for (size_t k = 0; k < groups.size(); ++k) {
    const uint64_t room = capacity - (lightest - groups[k].front().weight);
    for (size_t c = 0; c < groups[k].size() && groups[k][c].weight <= room; ++c) alive.push(c);
    alive.end_group();
  }
  const Relaxation relaxation = relax(groups, alive, capacity);
  std::vector<size_t> incumbent = relaxation.choice;
  fill_greedily(groups, alive, capacity, incumbent, relaxation.weight);
  const double incumbent_time = total_time(groups, incumbent);

  // The optimum lies between the LP bound and the incumbent, usually nearer
  // the bound. A search below a target T cuts far more than one below the
  // incumbent (items and states whose bound exceeds T go), and finding
  // nothing below T proves the optimum is above it. So the target starts
  // just above the bound and doubles its distance from it until a selection
  // turns up; the last search, below the incumbent, cannot come back empty
  // handed in exact arithmetic, and the incumbent answers if rounding says
  // otherwise.
  const double lower_bound = lagrangian_bound(groups, alive, capacity, relaxation.lambda);
  const double gap = incumbent_time - lower_bound;
  for (double share = 1.0 / 32; share < 1; share *= 2) {
    if (auto found = fastest_within(groups, alive, capacity, relaxation.lambda, lower_bound + share * gap)) {
      return total_time(groups, *found) <= incumbent_time ? *found : incumbent;
    }
  }
  const auto found = fastest_within(groups, alive, capacity, relaxation.lambda, incumbent_time);
  return found && total_time(groups, *found) <= incumbent_time ? *found : incumbent;
}

}  // namespace vtrain::balancer::internal
