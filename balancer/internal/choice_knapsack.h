// The multiple-choice knapsack behind WD: pick one item from every group so
// that the total time is least and the total weight (workspace) fits a
// capacity. Exact; see choice_knapsack.cpp for the method.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace vtrain::balancer::internal {

struct KnapsackItem {
  double time = 0;      // finite, >= 0
  uint64_t weight = 0;
};

// `groups[k]` must be non-empty and sorted by weight strictly ascending with
// time strictly descending (a Pareto front). Returns, per group, the index
// of the chosen item in an optimal selection; nullopt when even the lightest
// items together exceed `capacity`. Among equally fast selections the one
// returned is unspecified but deterministic.
std::optional<std::vector<size_t>> solve_choice_knapsack(std::span<const std::vector<KnapsackItem>> groups,
                                                         uint64_t capacity);

}  // namespace vtrain::balancer::internal
