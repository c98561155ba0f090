#include "worker/train/drift_detector.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace vtrain::worker {
namespace {

// The median of the values > 0 of `values` (a rank that did not train in
// a step passes 0), or 0 when there are none.
double median_of_positive(const std::deque<double>& values) {
  std::vector<double> v;
  for (double x : values) {
    if (x > 0) v.push_back(x);
  }
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (upper + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
}

}  // namespace

DriftDetector::DriftDetector(int64_t window, int64_t patience, double threshold)
    : window_(window), patience_(patience), threshold_(threshold) {
  if (window < 1) throw std::invalid_argument("drift detector: window must be >= 1");
  if (patience < 1) throw std::invalid_argument("drift detector: patience must be >= 1");
  if (!(threshold > 0)) throw std::invalid_argument("drift detector: threshold must be > 0");
}

bool DriftDetector::add(std::span<const double> ratios) {
  if (history_.empty()) history_.resize(ratios.size());
  if (ratios.size() != history_.size()) {
    throw std::invalid_argument("drift detector: " + std::to_string(ratios.size()) +
                                " ratios, expected one per rank (" +
                                std::to_string(history_.size()) + ")");
  }
  for (size_t r = 0; r < ratios.size(); ++r) {
    history_[r].push_back(std::isfinite(ratios[r]) && ratios[r] > 0 ? ratios[r] : 0.0);
    if (static_cast<int64_t>(history_[r].size()) > window_) history_[r].pop_front();
  }
  drift_ = 0;
  if (static_cast<int64_t>(history_.front().size()) < window_) return false;
  double low = 0, high = 0;
  for (double m : medians()) {
    if (m <= 0) continue;
    low = low > 0 ? std::min(low, m) : m;
    high = std::max(high, m);
  }
  drift_ = low > 0 ? high / low - 1 : 0;
  above_ = drift_ > threshold_ ? above_ + 1 : 0;
  return above_ >= patience_;
}

void DriftDetector::reset() {
  for (std::deque<double>& h : history_) h.clear();
  above_ = 0;
}

std::vector<double> DriftDetector::medians() const {
  std::vector<double> out;
  for (const std::deque<double>& h : history_) out.push_back(median_of_positive(h));
  return out;
}

}  // namespace vtrain::worker
