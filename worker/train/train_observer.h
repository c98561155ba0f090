// Hooks into the training loop. The trainer calls them on the rank that
// owns the observer, on its own thread; an observer may throw to fail the
// rank at that point (failure_injection.h, the tests' way to fail one rank).
#pragma once

#include <cstdint>
#include <vector>

namespace vtrain::worker {

// Where a step stands when a hook fires.
struct StepEvent {
  int64_t step = 0;  // steps completed before this one, over the whole run (resumes included)
  // This rank launches gradient allreduces during backward (several ranks
  // and samples of its own); otherwise on_bucket_launched never fires.
  bool allreduce_in_backward = false;
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  // Before the step does any work: no collective of this step is in flight.
  virtual void on_step_start(const StepEvent& step) { (void)step; }
  // In backward, right after this rank launched the allreduce of a gradient
  // bucket. If it throws, the trainer waits for the allreduces in flight
  // while unwinding, before their buffers are freed.
  virtual void on_bucket_launched(const StepEvent& step) { (void)step; }
  // After this rank's forward and backward (`seconds` of host time since the
  // step began), before its compute time is read and it waits for the
  // gradient exchange: time spent here counts as compute.
  virtual void on_compute_done(const StepEvent& step, double seconds) {
    (void)step;
    (void)seconds;
  }
  // After the forward pass a rank without samples times now and then
  // (RebalanceSettings::probe_every), before its time is read: time spent
  // here counts as the probe's.
  virtual void on_probe_done(const StepEvent& step, double seconds) {
    (void)step;
    (void)seconds;
  }
};

// Several observers, called in the order added. Not owned.
class ObserverList : public TrainObserver {
 public:
  void add(TrainObserver* observer) { observers_.push_back(observer); }
  bool empty() const { return observers_.empty(); }
  void on_step_start(const StepEvent& step) override {
    for (TrainObserver* o : observers_) o->on_step_start(step);
  }
  void on_bucket_launched(const StepEvent& step) override {
    for (TrainObserver* o : observers_) o->on_bucket_launched(step);
  }
  void on_compute_done(const StepEvent& step, double seconds) override {
    for (TrainObserver* o : observers_) o->on_compute_done(step, seconds);
  }
  void on_probe_done(const StepEvent& step, double seconds) override {
    for (TrainObserver* o : observers_) o->on_probe_done(step, seconds);
  }

 private:
  std::vector<TrainObserver*> observers_;
};

}  // namespace vtrain::worker
