#include "worker/train/step_watch.h"

#include <string>
#include <vector>

#include "common/text.h"

namespace vtrain::worker {

using Clock = std::chrono::steady_clock;

StepWatch::StepWatch(StepWatchOptions options, PeerProbe* probe,
                     std::function<std::string(int)> describe_rank,
                     std::function<void(const std::string&)> on_stall)
    : options_(options),
      probe_(probe),
      describe_rank_(std::move(describe_rank)),
      on_stall_(std::move(on_stall)),
      thread_([this] { run(); }) {}

StepWatch::~StepWatch() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StepWatch::on_step_start(const StepEvent& step) {
  started_.store(Clock::now().time_since_epoch().count());
  step_.store(step.step);
}

void StepWatch::run() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, options_.tick, [this] { return stopping_; })) {
    // A stuck rank still answers the others' pings: they name only the lost.
    if (probe_) probe_->answer();
    const int64_t step = step_.load();
    if (step < 0) continue;
    const Clock::duration waited =
        Clock::now() - Clock::time_point(Clock::duration(started_.load()));
    if (waited < options_.timeout) continue;
    lock.unlock();
    on_stall_(verdict(step, waited));
    return;
  }
}

std::string StepWatch::verdict(int64_t step, Clock::duration waited) {
  const double seconds = std::chrono::duration<double>(waited).count();
  std::string text = common::format(
      "step %lld has not finished after %.1f s (train.step_timeout %g s): ",
      static_cast<long long>(step), seconds,
      std::chrono::duration<double>(options_.timeout).count());
  const std::vector<int> silent =
      probe_ ? probe_->silent_ranks(options_.probe_window) : std::vector<int>{};
  if (!probe_) return text + "a rank or its host is lost or stuck; ending the job";
  if (silent.empty()) {
    return text + "every rank answers, so none is lost: a step this long needs a larger "
                  "train.step_timeout; ending the job";
  }
  std::vector<std::string> names;
  for (int r : silent) names.push_back(describe_rank_(r));
  return text + common::format("no answer within %g s from %s: its host or the link to it is "
                               "lost; ending the job",
                               std::chrono::duration<double>(options_.probe_window).count(),
                               common::join(names, ", ").c_str());
}

}  // namespace vtrain::worker
