// An in-order stream of host work on its own thread: the CPU backend's
// memory stream, so that offload and prefetch copies really overlap compute.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <utility>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace vtrain::common {

class HostStream {
 public:
  // `lazy` (tests): queued work starts only once a wait() asks for it, as
  // if the stream were slow, so that a caller that forgot to wait reads what
  // was there before the work.
  explicit HostStream(bool lazy = false);
  ~HostStream();  // drains the queue, then joins
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  // Queues `work`; it runs after everything queued before it.
  void enqueue(std::function<void()> work);
  // A ticket that is reached once everything queued so far has run.
  uint64_t record();
  // Blocks until `ticket` is reached. Rethrows the first exception a queued
  // task threw (once).
  void wait(uint64_t ticket);
  void wait_all() { wait(record()); }

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<std::function<void()>> queue_;
  uint64_t issued_ = 0;     // tasks queued so far
  uint64_t completed_ = 0;  // tasks finished so far
  const bool lazy_;
  uint64_t released_ = 0;   // lazy: tasks a wait() asked for so far
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace vtrain::common
