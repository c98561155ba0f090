// Host staging of training and test batches: gathering samples from a
// dataset, normalising them, and uploading them to the network's input.
#pragma once

#include <cstdint>
#include <memory_resource>
#include <optional>
#include <span>
#include <vector>

#include "common/host_stream.h"
#include "worker/data/data.h"
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
};

// Gathers and normalises the samples of stage.indices into stage.
void gather_staged(const Dataset& data, const ChannelStats& norm, Staging& stage);

// Copies a gathered batch to the network's input (Network::upload_input:
// from its prefetched copy when there is one) and labels. Returns whether
// the prefetched copy was taken.
bool upload_staged(Network& net, const Staging& stage);

// Gathers the next training batch on a thread of its own while the current
// step computes, so that a step waits only for its upload. Worth it where
// gathering takes longer than handing work to a thread: batches of at least
// kMinPixels values (ImageNet-size inputs; not LeNet on 28x28), unless
// TrainerOptions::gather_ahead says otherwise. `data` and `norm` must
// outlive the gatherer; the batches are staged in `host` memory.
class BatchGatherer {
 public:
  static constexpr int64_t kMinPixels = int64_t{1} << 20;

  BatchGatherer(const Dataset& data, const ChannelStats& norm, bool ahead,
                std::pmr::memory_resource* host);
  BatchGatherer(const BatchGatherer&) = delete;
  BatchGatherer& operator=(const BatchGatherer&) = delete;

  // The batch of `indices`, gathered: the one gathered ahead when it is that
  // batch, else gathered now. Valid until the next take(). Rethrows a failed
  // gather ahead.
  const Staging& take(std::span<const int64_t> indices);
  // Starts gathering `indices` for a later take() (no-op without a thread).
  void gather_ahead(std::span<const int64_t> indices);
  // The batch gathered ahead, once its gathering has finished (waits for
  // it); null when none is. Its memory stays where it is, unchanged, until
  // the take() that returns it (which swaps it into the current batch,
  // still unchanged) is followed by a gather_ahead(), or until a
  // gather_ahead() without such a take(). A device copy of it made in
  // between (Network::prefetch_input) must be over by then: the trainer
  // uploads every batch it takes (Network::upload_input waits for the
  // copy) before it gathers the next. Rethrows a failed gather.
  const Staging* finish_ahead();

 private:
  enum class Ahead { kNone, kGathering, kReady };
  const Dataset& data_;
  const ChannelStats& norm_;
  Staging current_, ahead_;  // ahead_ belongs to the thread while kGathering
  Ahead ahead_state_ = Ahead::kNone;
  // Last: destroyed first, finishing a gather in flight while ahead_ lives.
  std::optional<common::HostStream> thread_;
};

}  // namespace vtrain::worker
