// A bound on how long a rank waits for a step (train.step_timeout). A rank
// whose peer's host died, or whose link to it is cut, waits in the step's
// collectives for ever: TCP never tells it. The watch times the interval
// between the starts of two steps (the step's compute and exchange, and
// what follows it: a checkpoint, an evaluation); when it passes the
// timeout, it asks which ranks still answer and hands the verdict to
// `on_stall`, which ends the job.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "worker/comm/peer_probe.h"
#include "worker/train/train_observer.h"

namespace vtrain::worker {

struct StepWatchOptions {
  std::chrono::milliseconds timeout{600000};  // > 0: the longest wait for a step
  std::chrono::milliseconds tick{100};        // how often the watch looks (and answers pings)
  std::chrono::milliseconds probe_window{3000};  // how long it waits for the other ranks' answers
};

class StepWatch : public TrainObserver {
 public:
  // `probe` (may be null: the verdict then names no rank) outlives the
  // watch; `describe_rank(r)` names rank r for the message ("rank 2 (host
  // node2)"); `on_stall(message)` is called once, on the watch's thread,
  // and is expected to end the process.
  StepWatch(StepWatchOptions options, PeerProbe* probe,
            std::function<std::string(int)> describe_rank,
            std::function<void(const std::string&)> on_stall);
  ~StepWatch() override;
  StepWatch(const StepWatch&) = delete;
  StepWatch& operator=(const StepWatch&) = delete;

  void on_step_start(const StepEvent& step) override;

 private:
  void run();
  std::string verdict(int64_t step, std::chrono::steady_clock::duration waited);

  const StepWatchOptions options_;
  PeerProbe* const probe_;
  const std::function<std::string(int)> describe_rank_;
  const std::function<void(const std::string&)> on_stall_;
  // The step that started last and when (steady clock ticks); -1: none yet.
  std::atomic<int64_t> step_{-1};
  std::atomic<std::chrono::steady_clock::rep> started_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace vtrain::worker
