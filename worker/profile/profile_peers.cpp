#include "worker/profile/profile_peers.h"

#include <algorithm>
#include <numeric>

namespace vtrain::worker {
namespace {

bool share_cores(const DeviceInfo& a, const DeviceInfo& b) {
  if (a.cpus.empty() || b.cpus.empty()) return true;
  return std::any_of(a.cpus.begin(), a.cpus.end(), [&](int c) {
    return std::find(b.cpus.begin(), b.cpus.end(), c) != b.cpus.end();
  });
}

bool profile_together(const DeviceInfo& a, const DeviceInfo& b) {
  if (a.host != b.host || a.backend != b.backend) return false;
  if (a.backend == "cpu") return share_cores(a, b);
  return a.name == b.name && a.library_version == b.library_version && a.threads == b.threads;
}

}  // namespace

std::vector<int> profile_group_colours(const std::vector<DeviceInfo>& ranks) {
  // Union-find over "profiles with": a group is a connected component
  // (cores {0,1}, {1,2} and {2,3} make one group), its root its lowest rank.
  std::vector<int> root(ranks.size());
  std::iota(root.begin(), root.end(), 0);
  const auto find = [&](int r) {
    while (root[r] != r) r = root[r];
    return r;
  };
  for (size_t i = 0; i < ranks.size(); ++i) {
    for (size_t j = i + 1; j < ranks.size(); ++j) {
      if (!profile_together(ranks[i], ranks[j])) continue;
      const int a = find(static_cast<int>(i)), b = find(static_cast<int>(j));
      root[std::max(a, b)] = std::min(a, b);
    }
  }
  std::vector<int> colours(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) colours[r] = find(static_cast<int>(r));
  return colours;
}

}  // namespace vtrain::worker
