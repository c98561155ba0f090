// Gradient sums through pinned host memory (worker/comm/host_staged.h), on
// the CPU backend over a fake second rank: the host communicator sees host
// copies, never the device buffers; the sums come back on wait(); buffers
// are kept per bucket and reused from step to step. The same path through
// mpirun: tests/mpi_test.cpp (VTRAIN_STAGE_GRADIENTS=1).
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/comm/host_staged.h"
#include "worker/device/backend.h"

namespace vtrain::worker {
namespace {

// A second rank holding the same gradients: a sum doubles each value. It
// remembers the buffers it was given.
class TwinRank final : public Communicator {
 public:
  explicit TwinRank(std::vector<const void*>* seen) : seen_(seen) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void allreduce_async(void* data, int64_t count, common::DataType type) override {
    if (type != common::DataType::kF32) throw std::invalid_argument("TwinRank sums f32 only");
    seen_->push_back(data);
    pending_.push_back({static_cast<float*>(data), count});
  }
  void wait() override {
    for (const auto& [data, count] : pending_) {
      for (int64_t i = 0; i < count; ++i) data[i] *= 2;
    }
    pending_.clear();
  }
  double allreduce_seconds() const override { return 0; }
  double wait_seconds() const override { return 0; }
  void allreduce_sum(std::vector<double>& values) override {
    for (double& v : values) v *= 2;
  }
  void broadcast(std::vector<float>&, int) override {}
  void broadcast(std::string&, int) override {}
  std::vector<std::string> gather(const std::string& text, int) override { return {text, text}; }
  void barrier() override {}
  [[noreturn]] void abort(int) override { throw std::runtime_error("abort"); }

 private:
  std::vector<const void*>* seen_;
  std::vector<std::pair<float*, int64_t>> pending_;
};

TEST(HostStaged, SumsGoThroughHostCopiesAndComeBackOnWait) {
  auto backend = make_backend({.kind = "cpu", .threads = 1});
  std::vector<const void*> seen;
  auto comm = make_host_staged_communicator(*backend, std::make_unique<TwinRank>(&seen));
  EXPECT_EQ(comm->size(), 2);
  auto* a = static_cast<float*>(backend->allocate_device(3 * sizeof(float)));
  auto* b = static_cast<float*>(backend->allocate_device(5 * sizeof(float)));
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 3; ++i) a[i] = static_cast<float>(i + 1);
    for (int i = 0; i < 5; ++i) b[i] = static_cast<float>(10 * (i + 1));
    comm->allreduce_async(a, 3);
    comm->allreduce_async(b, 5);
    // Nothing comes back before wait().
    EXPECT_EQ(a[2], 3.0f);
    comm->wait();
    backend->synchronize(StreamKind::kCompute);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], 2.0f * static_cast<float>(i + 1)) << step;
    for (int i = 0; i < 5; ++i) EXPECT_EQ(b[i], 20.0f * static_cast<float>(i + 1)) << step;
  }
  // Each bucket had a host buffer of its own, not the device's, and the
  // second step reused the first's.
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_NE(seen[0], static_cast<const void*>(a));
  EXPECT_NE(seen[1], static_cast<const void*>(b));
  EXPECT_NE(seen[0], seen[1]);
  EXPECT_EQ(seen[2], seen[0]);
  EXPECT_EQ(seen[3], seen[1]);
  // The small collectives go to the host communicator as they are.
  std::vector<double> sums{1.5, -2};
  comm->allreduce_sum(sums);
  EXPECT_EQ(sums, (std::vector<double>{3, -4}));
  backend->free_device(a);
  backend->free_device(b);
}

TEST(HostStaged, SharedDevicesAreNamedByTheirFirstTwoRanks) {
  EXPECT_EQ(shared_device({"n1/0000:01:00.0", "n1/0000:41:00.0", "n2/0000:01:00.0"}), "");
  EXPECT_EQ(shared_device({"n1/0000:01:00.0", "n1/0000:41:00.0", "n1/0000:01:00.0",
                           "n1/0000:41:00.0"}),
            "ranks 0 and 2 share n1/0000:01:00.0");
  EXPECT_EQ(shared_device({"", "", "n1/a"}), "");  // devices without a key never match
  EXPECT_EQ(shared_device({}), "");
}

}  // namespace
}  // namespace vtrain::worker
