#include "common/host_stream.h"

namespace vtrain::common {

HostStream::HostStream(bool lazy) : lazy_(lazy), thread_([this] { run(); }) {}

HostStream::~HostStream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  thread_.join();
}

void HostStream::enqueue(std::function<void()> work) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(work));
    ++issued_;
  }
  work_ready_.notify_one();
}

uint64_t HostStream::record() {
  std::lock_guard lock(mutex_);
  return issued_;
}

void HostStream::wait(uint64_t ticket) {
  std::unique_lock lock(mutex_);
  if (lazy_ && ticket > released_) {
    released_ = ticket;
    work_ready_.notify_one();
  }
  work_done_.wait(lock, [&] { return completed_ >= ticket; });
  if (error_) {
    std::exception_ptr error = std::exchange(error_, nullptr);
    std::rethrow_exception(error);
  }
}

void HostStream::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    // Lazy: the next task once a wait() asked for it (the destructor drains).
    work_ready_.wait(lock, [&] {
      return stopping_ || (!queue_.empty() && (!lazy_ || completed_ < released_));
    });
    if (queue_.empty()) return;  // stopping and drained
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      work();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    ++completed_;
    work_done_.notify_all();
  }
}

}  // namespace vtrain::common
