#include "worker/train/batch_gatherer.h"

#include <algorithm>
#include <utility>

namespace vtrain::worker {

void gather_staged(const Dataset& data, const ChannelStats& norm, Staging& stage) {
  const auto n = static_cast<int64_t>(stage.indices.size());
  stage.images.resize(static_cast<size_t>(n * data.sample.per_sample()));
  stage.labels.resize(static_cast<size_t>(n));
  gather_batch(data, stage.indices, norm, stage.images.data(), stage.labels.data());
}

bool upload_staged(Network& net, const Staging& stage) {
  const auto n = static_cast<int64_t>(stage.indices.size());
  const bool prefetched = net.upload_input(stage.images.data(), n);
  net.backend().upload_labels(stage.labels.data(), net.labels(), n);
  return prefetched;
}

BatchGatherer::BatchGatherer(const Dataset& data, const ChannelStats& norm, bool ahead,
                             std::pmr::memory_resource* host)
    : data_(data), norm_(norm), current_(host), ahead_(host) {
  if (ahead) thread_.emplace();
}

const Staging& BatchGatherer::take(std::span<const int64_t> indices) {
  if (const Ahead state = std::exchange(ahead_state_, Ahead::kNone); state != Ahead::kNone) {
    if (state == Ahead::kGathering) thread_->wait_all();  // rethrows a failed gather
    if (std::equal(indices.begin(), indices.end(), ahead_.indices.begin(),
                   ahead_.indices.end())) {
      std::swap(current_, ahead_);
      return current_;
    }
  }
  current_.indices.assign(indices.begin(), indices.end());
  gather_staged(data_, norm_, current_);
  return current_;
}

void BatchGatherer::gather_ahead(std::span<const int64_t> indices) {
  if (!thread_) return;
  if (std::exchange(ahead_state_, Ahead::kNone) == Ahead::kGathering) thread_->wait_all();
  ahead_.indices.assign(indices.begin(), indices.end());
  thread_->enqueue([this] { gather_staged(data_, norm_, ahead_); });
  ahead_state_ = Ahead::kGathering;
}

const Staging* BatchGatherer::finish_ahead() {
  if (ahead_state_ == Ahead::kGathering) {
    ahead_state_ = Ahead::kNone;  // stays so when the gather failed
    thread_->wait_all();
    ahead_state_ = Ahead::kReady;
  }
  return ahead_state_ == Ahead::kReady ? &ahead_ : nullptr;
}

}  // namespace vtrain::worker
