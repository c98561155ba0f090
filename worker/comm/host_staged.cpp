#include "worker/comm/host_staged.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <utility>

#include "common/precision.h"
#include "worker/comm/host_collectives.h"

namespace vtrain::worker {
namespace {

class HostStagedCommunicator final : public HostCollectivesOf {
 public:
  HostStagedCommunicator(Backend& backend, std::unique_ptr<Communicator> host)
      : HostCollectivesOf(std::move(host)), backend_(backend) {}
  ~HostStagedCommunicator() override {
    try {
      host_->wait();
      backend_.synchronize(StreamKind::kCompute);  // no copy still reads a buffer
    } catch (...) {
      // Destruction during error handling: the error was reported already.
    }
    for (Slot& s : slots_) backend_.free_pinned(s.host);
  }
  HostStagedCommunicator(const HostStagedCommunicator&) = delete;
  HostStagedCommunicator& operator=(const HostStagedCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void allreduce_async(void* data, int64_t count, common::DataType type) override {
    if (host_->size() == 1 || count == 0) return;
    const auto start = std::chrono::steady_clock::now();
    const size_t bytes = static_cast<size_t>(count) * common::element_bytes(type);
    if (queued_ == slots_.size()) slots_.push_back({});
    Slot& s = slots_[queued_];
    // A slot past the queued ones is read by nothing: wait() synchronised
    // the copies back. One far larger than its bucket (the profiler's
    // single bucket of every gradient) is given back.
    if (s.capacity < bytes || s.capacity > 2 * bytes) {
      if (s.host) backend_.free_pinned(s.host);
      s.host = nullptr;
      s.capacity = 0;
      s.host = backend_.allocate_pinned(bytes);
      s.capacity = bytes;
    }
    // After the kernels that made the bucket; then the host has it.
    backend_.copy_async(s.host, data, bytes, StreamKind::kCompute);
    backend_.synchronize(StreamKind::kCompute);
    host_->allreduce_async(s.host, count, type);
    s.device = data;
    s.bytes = bytes;
    ++queued_;
    // The host waited for the compute stream: time the exchange cost it.
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    const size_t queued = std::exchange(queued_, 0);  // also when the sums fail
    host_->wait();
    for (size_t k = 0; k < queued; ++k) {
      backend_.copy_async(slots_[k].device, slots_[k].host, slots_[k].bytes,
                          StreamKind::kCompute);
    }
    // As NCCL's wait(): the sums are in place when it returns, for readers
    // on any stream, and no copy reads a slot any more.
    backend_.synchronize(StreamKind::kCompute);
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  double allreduce_seconds() const override { return host_->allreduce_seconds(); }
  double wait_seconds() const override { return wait_seconds_; }

  [[noreturn]] void abort(int code) override {
    host_->abort(code);
    std::_Exit(code);  // abort() does not return; be certain
  }

 private:
  // One queued allreduce's bucket: its device memory and its host copy.
  struct Slot {
    void* host = nullptr;
    size_t capacity = 0;  // bytes of `host`
    void* device = nullptr;
    size_t bytes = 0;
  };

  Backend& backend_;
  std::vector<Slot> slots_;  // the k-th allreduce since the last wait() uses slots_[k]
  size_t queued_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_host_staged_communicator(Backend& backend,
                                                            std::unique_ptr<Communicator> host) {
  return std::make_unique<HostStagedCommunicator>(backend, std::move(host));
}

std::string shared_device(const std::vector<std::string>& keys) {
  std::map<std::string, size_t> first;
  for (size_t r = 0; r < keys.size(); ++r) {
    if (keys[r].empty()) continue;
    const auto [at, fresh] = first.emplace(keys[r], r);
    if (!fresh) {
      std::string text = "ranks ";
      text += std::to_string(at->second);
      text += " and ";
      text += std::to_string(r);
      text += " share ";
      text += keys[r];
      return text;
    }
  }
  return {};
}

}  // namespace vtrain::worker
