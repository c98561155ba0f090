// A communicator for tests of the host collectives without MPI: rank `rank`
// of a job of inbox.size() ranks, whose other ranks "sent" `inbox` (rank
// r's text at r; its own entry is ignored). gather() hands the root every
// rank's text, this rank's own at its place; broadcast() of a text hands a
// receiver the root's entry. The other collectives do nothing.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "worker/comm/communicator.h"

namespace vtrain::worker {

class ScriptedComm final : public Communicator {
 public:
  ScriptedComm(int rank, std::vector<std::string> inbox) : rank_(rank), inbox_(std::move(inbox)) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(inbox_.size()); }
  void allreduce_async(void*, int64_t, common::DataType) override {}
  void wait() override {}
  double allreduce_seconds() const override { return 0; }
  double wait_seconds() const override { return 0; }
  void allreduce_sum(std::vector<double>&) override {}
  void broadcast(std::vector<float>&, int) override {}
  void broadcast(std::string& text, int root) override {
    if (root != rank_) text = inbox_.at(static_cast<size_t>(root));
  }
  std::vector<std::string> gather(const std::string& text, int root) override {
    if (root != rank_) return {};
    std::vector<std::string> all = inbox_;
    all.at(static_cast<size_t>(rank_)) = text;
    return all;
  }
  void barrier() override {}
  [[noreturn]] void abort(int) override { throw std::runtime_error("abort"); }

 private:
  int rank_;
  std::vector<std::string> inbox_;
};

}  // namespace vtrain::worker
