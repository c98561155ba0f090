// Host staging of training and test batches: gathering samples from a
// dataset (decoding and transforming image files, on a decoding pool when
// there is one), normalising them, and uploading them to the network's input.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <memory_resource>
#include <optional>
#include <span>
#include <vector>

#include "common/host_stream.h"
#include "worker/data/data.h"
#include "worker/data/decode_pool.h"
#include "worker/device/pinned_memory.h"
#include "worker/engine/network.h"

namespace vtrain::worker {

// Host staging for one batch, uploaded to the network's input; its images
// in `host` memory.
struct Staging {
  explicit Staging(std::pmr::memory_resource* host) : images(host) {}
  std::pmr::vector<float> images;
  std::vector<int32_t> labels;
  std::vector<int64_t> indices;  // the samples of the batch, in order
  int64_t epoch = 0;             // whose random choices (transforms) the samples got
};

// A batch to gather: its samples and the epoch they are drawn in.
struct BatchRef {
  std::span<const int64_t> indices;
  int64_t epoch = 0;
};

// Gathers and normalises the samples of stage.indices into stage, each
// sample's random choices drawn from (seed, stage.epoch, its index); on
// `pool`'s threads when given and the data needs more than a copy.
void gather_staged(const Dataset& data, const ChannelStats& norm, Staging& stage, uint64_t seed = 0,
                   DecodePool* pool = nullptr);

// Copies a gathered batch to the network's input (Network::upload_input:
// from its prefetched copy when there is one) and labels. Returns whether
// the prefetched copy was taken.
bool upload_staged(Network& net, const Staging& stage);

// How a BatchGatherer gathers.
struct GatherSettings {
  uint64_t seed = 0;         // the transforms' random choices (TrainSettings::seed, train.seed)
  int prefetch_batches = 1;  // batches gathered ahead at most (data.prefetch_batches)
  DecodePool* pool = nullptr;  // decoding threads; null: the gathering thread alone
};

// Gathers the next training batches on a thread of its own while the
// current step computes, so that a step waits only for its upload. Worth it
// where gathering takes longer than handing work to a thread: batches of at
// least kMinPixels values (ImageNet-size inputs; not LeNet on 28x28), or
// image files, unless TrainerOptions::gather_ahead says otherwise. `data`,
// `norm` and the pool must outlive the gatherer; the batches are staged in
// `host` memory, in buffers reused from batch to batch.
class BatchGatherer {
 public:
  static constexpr int64_t kMinPixels = int64_t{1} << 20;

  BatchGatherer(const Dataset& data, const ChannelStats& norm, bool ahead,
                std::pmr::memory_resource* host, GatherSettings settings = {});
  BatchGatherer(const BatchGatherer&) = delete;
  BatchGatherer& operator=(const BatchGatherer&) = delete;

  // The batch `batch`, gathered: the one gathered ahead when it is that
  // batch, else gathered now (batches gathered ahead before it, no longer
  // wanted after a change of split, are dropped). Valid until the next
  // take(). Rethrows a failed gather.
  const Staging& take(BatchRef batch);
  // Starts gathering the batches that follow, in order (up to
  // GatherSettings::prefetch_batches of them; those already on their way
  // are kept). No-op without a thread.
  void gather_ahead(std::span<const BatchRef> next);
  // The next batch gathered ahead, once its gathering has finished (waits
  // for it); null when none is. Its memory stays where it is, unchanged,
  // until the take() that returns it is followed by a gather_ahead(), or
  // until a gather_ahead() without such a take(). A device copy of it made
  // in between (Network::prefetch_input) must be over by then: the trainer
  // uploads every batch it takes (Network::upload_input waits for the
  // copy) before it gathers the next. Rethrows a failed gather.
  const Staging* finish_ahead();

  // Seconds the last take() waited for its batch (to be gathered now, or
  // to finish gathering ahead): the step's input wait.
  double last_wait_seconds() const { return last_wait_; }

 private:
  struct Slot {
    std::unique_ptr<Staging> stage;
    uint64_t ticket = 0;  // the gathering thread's, reached when the batch is gathered
  };
  std::unique_ptr<Staging> spare();
  void recycle(std::unique_ptr<Staging> stage);

  const Dataset& data_;
  const ChannelStats& norm_;
  std::pmr::memory_resource* host_;
  GatherSettings settings_;
  std::unique_ptr<Staging> current_;
  std::deque<Slot> ahead_;                     // in the order they will be taken
  std::vector<std::unique_ptr<Staging>> free_;  // buffers to reuse
  double last_wait_ = 0;
  // Last: destroyed first, finishing the gathers in flight while their buffers live.
  std::optional<common::HostStream> thread_;
};

}  // namespace vtrain::worker
