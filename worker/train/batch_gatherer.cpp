#include "worker/train/batch_gatherer.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "worker/data/gather.h"

namespace vtrain::worker {
namespace {

bool same_batch(const Staging& stage, const BatchRef& batch) {
  return stage.epoch == batch.epoch &&
         std::equal(batch.indices.begin(), batch.indices.end(), stage.indices.begin(), stage.indices.end());
}

}  // namespace

void gather_staged(const Dataset& data, const ChannelStats& norm, Staging& stage, uint64_t seed,
                   DecodePool* pool) {
  const auto n = static_cast<int64_t>(stage.indices.size());
  stage.images.resize(static_cast<size_t>(n * data.sample.per_sample()));
  stage.labels.resize(static_cast<size_t>(n));
  const SampleDraw draw{seed, stage.epoch};
  if (pool != nullptr && transforms_samples(data)) {
    pool->gather(data, stage.indices, pixel_norm(norm.mean, norm.stddev), draw, stage.images.data(),
                 stage.labels.data());
  } else {
    gather_batch(data, stage.indices, norm, draw, stage.images.data(), stage.labels.data());
  }
}

bool upload_staged(Network& net, const Staging& stage) {
  const auto n = static_cast<int64_t>(stage.indices.size());
  const bool prefetched = net.upload_input(stage.images.data(), n);
  net.backend().upload_labels(stage.labels.data(), net.labels(), n);
  return prefetched;
}

BatchGatherer::BatchGatherer(const Dataset& data, const ChannelStats& norm, bool ahead,
                             std::pmr::memory_resource* host, GatherSettings settings)
    : data_(data), norm_(norm), host_(host), settings_(settings), current_(std::make_unique<Staging>(host)) {
  settings_.prefetch_batches = std::max(1, settings_.prefetch_batches);
  if (ahead) thread_.emplace();
}

std::unique_ptr<Staging> BatchGatherer::spare() {
  if (free_.empty()) return std::make_unique<Staging>(host_);
  std::unique_ptr<Staging> stage = std::move(free_.back());
  free_.pop_back();
  return stage;
}

void BatchGatherer::recycle(std::unique_ptr<Staging> stage) { free_.push_back(std::move(stage)); }

const Staging& BatchGatherer::take(BatchRef batch) {
  const auto start = std::chrono::steady_clock::now();
  auto done = [&]() -> const Staging& {
    last_wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return *current_;
  };
  while (!ahead_.empty()) {
    Slot slot = std::move(ahead_.front());
    ahead_.pop_front();
    thread_->wait(slot.ticket);  // rethrows a failed gather (the slot is gone by then)
    if (same_batch(*slot.stage, batch)) {
      recycle(std::exchange(current_, std::move(slot.stage)));
      return done();
    }
    recycle(std::move(slot.stage));  // gathered for a split no longer in force
  }
  current_->indices.assign(batch.indices.begin(), batch.indices.end());
  current_->epoch = batch.epoch;
  gather_staged(data_, norm_, *current_, settings_.seed, settings_.pool);
  return done();
}

void BatchGatherer::gather_ahead(std::span<const BatchRef> next) {
  if (!thread_) return;
  next = next.first(std::min(next.size(), static_cast<size_t>(settings_.prefetch_batches)));
  size_t kept = 0;
  while (kept < ahead_.size() && kept < next.size() && same_batch(*ahead_[kept].stage, next[kept])) ++kept;
  if (kept < ahead_.size()) {
    thread_->wait(ahead_.back().ticket);  // the dropped ones may still be gathering
    while (ahead_.size() > kept) {
      recycle(std::move(ahead_.back().stage));
      ahead_.pop_back();
    }
  }
  for (size_t k = kept; k < next.size(); ++k) {
    std::unique_ptr<Staging> stage = spare();
    stage->indices.assign(next[k].indices.begin(), next[k].indices.end());
    stage->epoch = next[k].epoch;
    Staging* s = stage.get();
    thread_->enqueue([this, s] { gather_staged(data_, norm_, *s, settings_.seed, settings_.pool); });
    ahead_.push_back({std::move(stage), thread_->record()});
  }
}

const Staging* BatchGatherer::finish_ahead() {
  if (ahead_.empty()) return nullptr;
  try {
    thread_->wait(ahead_.front().ticket);
  } catch (...) {
    ahead_.pop_front();  // a failed gather is never handed out
    throw;
  }
  return ahead_.front().stage.get();
}

}  // namespace vtrain::worker
