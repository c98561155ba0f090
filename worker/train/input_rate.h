// A rank's input as the batch split prices it: the images/s of its input
// (measured through common::InputRateSource), and the throttle that makes
// a rank's input slower than it is (VTRAIN_INPUT_RATE_LIMIT: a node with
// fewer decoding cores, simulated, for tests and what-ifs on one machine).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "common/input_rate_source.h"
#include "worker/data/data.h"

namespace vtrain::worker {

// The signature of `data`'s training input (InputRateSource::transform):
// "normalise" for samples only normalised; else data.transform.str() and
// " + normalise" (e.g. "random_resized (scale 0.08-1, ratio 0.75-1.333) +
// flip + normalise").
std::string input_transform(const Dataset& data);

// A rank's training input as training makes it (common::InputRateSource):
// batches gathered through data.transform by the trainer's path
// (gather_staged), on a decoding pool of `pool_workers` threads where the
// samples need more than a copy (image files or a transform) and
// pool_workers > 0, as TrainerOptions::data_workers makes the trainer do;
// otherwise on one thread. The batches are consecutive slices of epoch
// 0's permutation for `seed` (wrapping around), the samples training
// starts with. `data` and `norm` must outlive it.
class GatherRateSource : public common::InputRateSource {
 public:
  GatherRateSource(const Dataset& data, const ChannelStats& norm, int pool_workers = 0, uint64_t seed = 0);
  // The pool's threads, or 1 without a pool.
  int workers() const override;
  std::string transform() const override { return input_transform(data_); }
  double measure_images_per_second(int64_t batch, int batches) override;

 private:
  const Dataset& data_;
  const ChannelStats& norm_;
  int pool_workers_;  // 0: no pool
  uint64_t seed_;
};

// The environment variable of the throttle: "RANK:IMAGES_PER_S", several
// separated by commas ("1:400,3:800").
inline constexpr const char* kInputRateLimitVariable = "VTRAIN_INPUT_RATE_LIMIT";

// The images/s `text` (kInputRateLimitVariable's syntax) limits `rank`'s
// input to, or nullopt when it names another rank. Throws
// std::invalid_argument naming the variable, the entry and what was
// expected (a rank >= 0, a rate > 0, each rank once).
std::optional<double> parse_input_rate_limit(const std::string& text, int rank);
// parse_input_rate_limit of the environment's variable; nullopt when unset.
std::optional<double> input_rate_limit_from_environment(int rank);

// Makes a rank's input come no faster than `images_per_second`, as a
// decoding pool of that rate would deliver it: a producer that makes batch
// after batch at that rate into a queue of `depth` batches, starting when
// the throttle is made, and that stops while the queue is full. wait()
// takes the next batch: it sleeps until the producer has made it and
// returns how long it slept. The producer is simulated (it takes no
// core): the batch itself is gathered as before.
class InputThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  InputThrottle(double images_per_second, int depth = 2);

  // Sleeps until the next batch of `batch` samples is made; returns the
  // milliseconds slept (0 when it was ready).
  double wait(int64_t batch);
  double images_per_second() const { return rate_; }

 private:
  double rate_;
  size_t depth_;
  Clock::time_point made_;            // when the producer finished its last batch
  std::deque<Clock::time_point> taken_;  // when the last `depth` batches were taken
};

}  // namespace vtrain::worker
