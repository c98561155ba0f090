// Stop requests by signal (SLURM pre-emption, time limits, scontrol requeue):
// SIGTERM and SIGUSR1 ask the trainer to checkpoint at the next step
// boundary and exit with code 3.
#pragma once

#include <atomic>
#include <thread>

namespace vtrain::launcher {

// Receives SIGTERM and SIGUSR1 on a thread of its own with sigwait(), so
// that no signal handler ever interrupts a compute thread: the process
// blocks both signals in every thread, which inherit the mask from the one
// that constructs this object. Construct it first in main(), before MPI,
// oneDNN or any other library starts a thread. Child processes get the two
// signals unblocked again.
class StopSignalWatcher {
 public:
  StopSignalWatcher();
  ~StopSignalWatcher();
  StopSignalWatcher(const StopSignalWatcher&) = delete;
  StopSignalWatcher& operator=(const StopSignalWatcher&) = delete;

  // The number of the first stop signal received, 0 while none.
  const std::atomic<int>& received() const { return received_; }

 private:
  void run();

  std::atomic<int> received_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace vtrain::launcher
