#include "launcher/stop_signals.h"

#include <pthread.h>
#include <signal.h>

namespace vtrain::launcher {
namespace {

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}

// fork() copies the mask: give children (an exec'd helper, MPI's singleton
// daemon) the default delivery back.
extern "C" void unblock_in_child() {
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

}  // namespace

StopSignalWatcher::StopSignalWatcher() {
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  pthread_atfork(nullptr, nullptr, unblock_in_child);
  thread_ = std::thread([this] { run(); });
}

StopSignalWatcher::~StopSignalWatcher() {
  stopping_.store(true);
  pthread_kill(thread_.native_handle(), SIGUSR1);
  thread_.join();
}

void StopSignalWatcher::run() {
  const sigset_t set = stop_signals();
  for (;;) {
    int signal = 0;
    if (sigwait(&set, &signal) != 0) continue;
    if (stopping_.load()) return;
    int none = 0;
    received_.compare_exchange_strong(none, signal);
  }
}

}  // namespace vtrain::launcher
