// A testing aid, not a feature: makes a rank throw at a chosen step, so that
// tests (tests/mpi_test.cpp) can check that one failing rank ends the whole
// job quickly and cleanly, also with a gradient allreduce in flight. The
// vtrain binary installs it from the environment:
//   VTRAIN_FAIL_AT_STEP=s     fail at step s (0-based, over the whole run)
//   VTRAIN_FAIL_RANK=r        only on rank r (unset: on every rank)
//   VTRAIN_FAIL_IN=backward   in backward, right after a gradient bucket's
//                             allreduce is launched; where the rank launches
//                             none (one rank, no samples), at the step's start
//   VTRAIN_FAIL_IN=start      at the step's start (the default)
//
// And a slowdown, for online re-balancing (tests/rebalance_mpi_test.cpp):
//   VTRAIN_SLOW_AT_STEP=s     from step s (0-based) on, this rank's compute
//                             takes `factor` times as long: after forward
//                             and backward it sleeps (factor - 1) times what
//                             they took, before its compute time is read
//                             (a rank without samples: after its probe)
//   VTRAIN_SLOW_UNTIL_STEP=e  ... until step e (exclusive; unset: to the end)
//   VTRAIN_SLOW_RANK=r        only on rank r (unset: on every rank)
//   VTRAIN_SLOW_FACTOR=f      the factor, a number >= 1 (default 2)
#pragma once

#include <cstdint>
#include <optional>

#include "worker/train/train_observer.h"

namespace vtrain::worker {

class FailureInjection : public TrainObserver {
 public:
  enum class Where { kStepStart, kBackward };

  FailureInjection(int64_t step, Where where) : step_(step), where_(where) {}

  // The failure the environment asks of `rank`, or nullopt where it asks
  // none. Throws std::invalid_argument naming the variable and what was
  // expected when a value is malformed.
  static std::optional<FailureInjection> from_environment(int rank);

  // Throw std::runtime_error "injected failure [in backward] at step N (...)".
  void on_step_start(const StepEvent& step) override;
  void on_bucket_launched(const StepEvent& step) override;

 private:
  int64_t step_;
  Where where_;
};

class SlowdownInjection : public TrainObserver {
 public:
  SlowdownInjection(int64_t from_step, int64_t until_step, double factor)
      : from_step_(from_step), until_step_(until_step), factor_(factor) {}

  // The slowdown the environment asks of `rank`, or nullopt. Throws
  // std::invalid_argument naming the variable and what was expected.
  static std::optional<SlowdownInjection> from_environment(int rank);

  void on_compute_done(const StepEvent& step, double seconds) override;
  void on_probe_done(const StepEvent& step, double seconds) override;

 private:
  int64_t from_step_, until_step_;
  double factor_;
};

}  // namespace vtrain::worker
