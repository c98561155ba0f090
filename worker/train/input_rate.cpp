#include "worker/train/input_rate.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <memory_resource>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "worker/data/decode_pool.h"
#include "worker/data/gather.h"
#include "worker/train/batch_gatherer.h"

namespace vtrain::worker {

GatherRateSource::GatherRateSource(const Dataset& data, const ChannelStats& norm, int pool_workers,
                                   uint64_t seed)
    : data_(data),
      norm_(norm),
      pool_workers_(pool_workers > 0 && transforms_samples(data) ? pool_workers : 0),
      seed_(seed) {}

int GatherRateSource::workers() const { return std::max(pool_workers_, 1); }

std::string input_transform(const Dataset& data) {
  return transforms_samples(data) ? data.transform.str() + " + normalise" : "normalise";
}

double GatherRateSource::measure_images_per_second(int64_t batch, int batches) {
  if (batch < 1 || batches < 1 || data_.count < 1) {
    throw std::invalid_argument("measuring the gather rate needs a batch, batches and samples >= 1");
  }
  // The pool lives for the measurement only: training makes its own.
  const std::unique_ptr<DecodePool> pool =
      pool_workers_ > 0 ? std::make_unique<DecodePool>(pool_workers_) : nullptr;
  const std::vector<int64_t> order = epoch_permutation(seed_, 0, data_.count);
  Staging stage(std::pmr::get_default_resource());
  stage.indices.resize(static_cast<size_t>(batch));
  std::vector<double> rates;
  int64_t next = 0;
  for (int b = 0; b < batches; ++b) {
    for (int64_t& i : stage.indices) i = order[static_cast<size_t>(next++ % data_.count)];
    const auto start = std::chrono::steady_clock::now();
    gather_staged(data_, norm_, stage, seed_, pool.get());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(static_cast<double>(batch) / std::max(seconds, 1e-9));
  }
  std::nth_element(rates.begin(), rates.begin() + static_cast<long>(rates.size() / 2), rates.end());
  return rates[rates.size() / 2];
}

std::optional<double> parse_input_rate_limit(const std::string& text, int rank) {
  const std::string where = std::string(kInputRateLimitVariable) + ": ";
  std::optional<double> mine;
  std::set<long> seen;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string entry = text.substr(at, comma - at);
    auto fail = [&](const std::string& why) {
      throw std::invalid_argument(where + "entry '" + entry + "': " + why +
                                  " (expected RANK:IMAGES_PER_S[,RANK:IMAGES_PER_S...], e.g. 1:400)");
    };
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) fail("no ':' between the rank and the rate");
    const std::string rank_text = entry.substr(0, colon), rate_text = entry.substr(colon + 1);
    char* end = nullptr;
    const long r = std::strtol(rank_text.c_str(), &end, 10);
    if (rank_text.empty() || *end != '\0' || r < 0) fail("the rank is not an integer >= 0");
    const double rate = std::strtod(rate_text.c_str(), &end);
    if (rate_text.empty() || *end != '\0' || !(rate > 0) || rate > 1e12) fail("the rate is not a number of images/s > 0");
    if (!seen.insert(r).second) fail("rank " + std::to_string(r) + " is limited twice");
    if (r == rank) mine = rate;
    at = comma + 1;
  }
  return mine;
}

std::optional<double> input_rate_limit_from_environment(int rank) {
  const char* text = std::getenv(kInputRateLimitVariable);
  if (text == nullptr || *text == '\0') return std::nullopt;
  return parse_input_rate_limit(text, rank);
}

InputThrottle::InputThrottle(double images_per_second, int depth)
    : rate_(images_per_second), depth_(static_cast<size_t>(std::max(depth, 1))), made_(Clock::now()) {
  if (!(rate_ > 0)) throw std::invalid_argument("an input throttle needs a rate > 0 images/s");
}

double InputThrottle::wait(int64_t batch) {
  // The producer starts this batch once it made the one before and a
  // queue slot is free (the batch `depth` before this one was taken).
  Clock::time_point start = made_;
  if (taken_.size() == depth_) start = std::max(start, taken_.front());
  made_ = start + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(static_cast<double>(batch) / rate_));
  const Clock::time_point now = Clock::now();
  double waited_ms = 0;
  if (made_ > now) {
    std::this_thread::sleep_until(made_);
    waited_ms = std::chrono::duration<double, std::milli>(made_ - now).count();
  }
  taken_.push_back(std::max(now, made_));
  if (taken_.size() > depth_) taken_.pop_front();
  return waited_ms;
}

}  // namespace vtrain::worker
