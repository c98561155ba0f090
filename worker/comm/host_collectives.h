// A communicator whose gradient allreduces are its own (NCCL's stream,
// host-staged buckets) and whose synchronous host collectives are those of
// the MPI communicator it holds: one place that forwards them.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/comm/communicator.h"

namespace vtrain::worker {

class HostCollectivesOf : public Communicator {
 public:
  void allreduce_sum(std::vector<double>& values) override { host_->allreduce_sum(values); }
  void broadcast(std::vector<float>& values, int root) override { host_->broadcast(values, root); }
  void broadcast(std::string& text, int root) override { host_->broadcast(text, root); }
  std::vector<std::string> gather(const std::string& text, int root) override {
    return host_->gather(text, root);
  }
  void barrier() override { host_->barrier(); }
  void barrier_while(const std::function<void()>& work) override { host_->barrier_while(work); }

 protected:
  explicit HostCollectivesOf(std::unique_ptr<Communicator> host) : host_(std::move(host)) {}

  std::unique_ptr<Communicator> host_;  // MPI, for the host-side collectives
};

}  // namespace vtrain::worker
