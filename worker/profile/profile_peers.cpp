#include "worker/profile/profile_peers.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "common/text.h"

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

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

void require_same_items(const ProfilePeers& peers, const std::string& settings) {
  if (!peers.together || peers.count < 2 || !peers.all_texts) return;
  const std::vector<std::string> texts = peers.all_texts(settings);
  const auto rank_of = [&](size_t member) {
    return member < peers.ranks.size() ? peers.ranks[member] : static_cast<int>(member);
  };
  std::vector<int64_t> ranks;
  for (size_t m = 0; m < texts.size(); ++m) ranks.push_back(rank_of(m));
  const std::vector<std::string> first = lines_of(texts.at(0));
  for (size_t m = 1; m < texts.size(); ++m) {
    const std::vector<std::string> other = lines_of(texts[m]);
    for (size_t i = 0; i < std::max(first.size(), other.size()); ++i) {
      const std::string a = i < first.size() ? first[i] : "(nothing)";
      const std::string b = i < other.size() ? other[i] : "(nothing)";
      if (a == b) continue;
      throw std::invalid_argument(common::format(
          "profile: the processes on shared cores (ranks %s) measure each work item together, "
          "so they need the same items, but rank %d has %s where rank %d has %s; give them the "
          "same model and profile settings",
          common::format_list(ranks).c_str(), rank_of(0), a.c_str(), rank_of(m), b.c_str()));
    }
  }
}

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
