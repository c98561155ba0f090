// Gradient sums through pinned host memory (worker/comm/host_staged.h), on
// the CPU backend over a fake second rank: the host communicator sees host
// copies, never the device buffers; the sums come back on wait(); buffers
// are kept per bucket and reused from step to step. The same path through
// mpirun: tests/mpi_test.cpp (VTRAIN_STAGE_GRADIENTS=1).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/comm/host_staged.h"
#include "worker/device/backend.h"

namespace vtrain::worker {
namespace {

// A second rank holding the same gradients: a sum doubles each value, at
// once, in the buffer it was given (so a copy back before wait() would
// show). f32, and bf16 by its exponent bits. It remembers the buffers, and
// throws from wait() when told to.
class TwinRank final : public Communicator {
 public:
  explicit TwinRank(std::vector<const void*>* seen) : seen_(seen) {}
  bool fail_next_wait = false;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void allreduce_async(void* data, int64_t count, common::DataType type) override {
    seen_->push_back(data);
    if (type == common::DataType::kF32) {
      for (int64_t i = 0; i < count; ++i) static_cast<float*>(data)[i] *= 2;
    } else if (type == common::DataType::kBF16) {
      for (int64_t i = 0; i < count; ++i) static_cast<uint16_t*>(data)[i] += 1 << 7;
    } else {
      throw std::invalid_argument("TwinRank sums f32 and bf16");
    }
  }
  void wait() override {
    if (fail_next_wait) {
      fail_next_wait = false;
      throw std::runtime_error("the sums failed");
    }
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
};

class HostStaged : public ::testing::Test {
 protected:
  float* device_floats(int count) {
    auto* p = static_cast<float*>(backend_->allocate_device(count * sizeof(float)));
    held_.push_back(p);
    return p;
  }
  void TearDown() override {
    for (void* p : held_) backend_->free_device(p);
  }
  std::unique_ptr<Backend> backend_ =
      make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  std::vector<const void*> seen_;
  TwinRank* twin_ = new TwinRank(&seen_);
  std::unique_ptr<Communicator> comm_ =
      make_host_staged_communicator(*backend_, std::unique_ptr<Communicator>(twin_));
  std::vector<void*> held_;
};

TEST_F(HostStaged, SumsGoThroughHostCopiesAndComeBackOnWait) {
  EXPECT_EQ(comm_->size(), 2);
  float* a = device_floats(3);
  float* b = device_floats(5);
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 3; ++i) a[i] = static_cast<float>(i + 1);
    for (int i = 0; i < 5; ++i) b[i] = static_cast<float>(10 * (i + 1));
    comm_->allreduce_async(a, 3);
    comm_->allreduce_async(b, 5);
    comm_->allreduce_async(b, 0);  // nothing to sum
    // The host copies hold the sums already; the device gets them on wait().
    EXPECT_EQ(a[2], 3.0f);
    comm_->wait();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], 2.0f * static_cast<float>(i + 1)) << step;
    for (int i = 0; i < 5; ++i) EXPECT_EQ(b[i], 20.0f * static_cast<float>(i + 1)) << step;
  }
  // Each bucket had a host buffer of its own, not the device's, and the
  // second step reused the first's.
  ASSERT_EQ(seen_.size(), 4u);
  EXPECT_NE(seen_[0], static_cast<const void*>(a));
  EXPECT_NE(seen_[1], static_cast<const void*>(b));
  EXPECT_NE(seen_[0], seen_[1]);
  EXPECT_EQ(seen_[2], seen_[0]);
  EXPECT_EQ(seen_[3], seen_[1]);
  // The small collectives go to the host communicator as they are.
  std::vector<double> sums{1.5, -2};
  comm_->allreduce_sum(sums);
  EXPECT_EQ(sums, (std::vector<double>{3, -4}));
}

// A bucket larger than its slot's buffer gets a larger one; a far smaller
// one a smaller one (the profiler's single bucket of every gradient is
// not kept for the step's small ones); 16-bit buckets sum as they are.
TEST_F(HostStaged, BuffersFollowTheBucketsAndHalfBucketsSumAsTheyAre) {
  float* big = device_floats(64);
  float* small = device_floats(4);
  for (int i = 0; i < 64; ++i) big[i] = 1.0f;
  for (int i = 0; i < 4; ++i) small[i] = 3.0f;
  comm_->allreduce_async(small, 4);
  comm_->wait();
  comm_->allreduce_async(big, 64);
  comm_->wait();
  comm_->allreduce_async(small, 4);
  comm_->wait();
  for (int i = 0; i < 64; ++i) ASSERT_EQ(big[i], 2.0f) << i;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(small[i], 12.0f) << i;
  auto* half = static_cast<uint16_t*>(backend_->allocate_device(2 * sizeof(uint16_t)));
  held_.push_back(half);
  half[0] = 0x3F80;  // bf16 1.0
  half[1] = 0xC040;  // bf16 -3.0
  comm_->allreduce_async(half, 2, common::DataType::kBF16);
  comm_->wait();
  EXPECT_EQ(half[0], 0x4000);  // 2.0
  EXPECT_EQ(half[1], 0xC0C0);  // -6.0
}

// A failed sum leaves no bucket queued: the next step starts clean.
TEST_F(HostStaged, AFailedWaitLeavesNothingQueued) {
  float* a = device_floats(2);
  a[0] = a[1] = 1.0f;
  comm_->allreduce_async(a, 2);
  twin_->fail_next_wait = true;
  EXPECT_THROW(comm_->wait(), std::runtime_error);
  a[0] = a[1] = 5.0f;
  comm_->allreduce_async(a, 2);
  comm_->wait();
  EXPECT_EQ(a[0], 10.0f);
  EXPECT_EQ(a[1], 10.0f);
}

TEST(SharedDevice, IsNamedByItsFirstTwoRanks) {
  EXPECT_EQ(shared_device({"n1/0000:01:00.0", "n1/0000:41:00.0", "n2/0000:01:00.0"}), "");
  EXPECT_EQ(shared_device({"n1/0000:01:00.0", "n1/0000:41:00.0", "n1/0000:01:00.0",
                           "n1/0000:41:00.0"}),
            "ranks 0 and 2 share n1/0000:01:00.0");
  EXPECT_EQ(shared_device({"", "", "n1/a"}), "");  // devices without a key never match
  EXPECT_EQ(shared_device({}), "");
}

}  // namespace
}  // namespace vtrain::worker
