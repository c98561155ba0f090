// The gradient allreduce of a data-parallel step: buckets launched while
// backward runs, completed before the update, in f32 or in the job's half
// type (train.gradient_allreduce).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/name_table.h"
#include "common/precision.h"
#include "worker/comm/communicator.h"
#include "worker/device/backend.h"
#include "worker/train/gradient_buckets.h"

namespace vtrain::worker {

// train.gradient_allreduce: the type gradient buckets travel in. kHalf is
// the half type every rank computes in (bf16 or fp16), so it needs a half
// train.precision; in a job whose ranks differ it falls back to f32.
enum class GradientAllreduce { kFp32, kHalf };
inline constexpr auto kGradientAllreduceNames = std::to_array<common::Named<GradientAllreduce>>(
    {{GradientAllreduce::kFp32, "fp32"}, {GradientAllreduce::kHalf, "half"}});

// The type buckets travel in for a job whose ranks compute in `ranks`
// (every rank's precision, in rank order): f32, or for kHalf the half
// type every rank stores in; f32 where the ranks' types differ (half
// gradients of two types cannot be summed as one). Throws
// std::invalid_argument naming train.gradient_allreduce for kHalf when
// every rank computes in one precision that is not half (fp32 or tf32).
common::DataType wire_type(GradientAllreduce type, std::span<const common::Precision> ranks);
// Device bytes per parameter a BucketAllreduce of `wire` over `ranks` ranks
// allocates (its staging buffer: none for f32 or one rank).
size_t staging_bytes_per_parameter(common::DataType wire, int ranks);

// Launches and completes the allreduces of a BucketPlan's buckets over the
// f32 gradient buffer of a network. With a 16-bit `wire` type each bucket
// is converted to it into a staging buffer of its own
// (staging_bytes_per_parameter of device memory, allocated here) on the compute stream before
// its allreduce, which adds in f32 and rounds each sum once
// (Communicator::allreduce_async), and converted back once every allreduce
// is done. Every rank must launch the same buckets in the same order.
class BucketAllreduce {
 public:
  // `wire`: kF32, or the half type of the job. `comm` may be null (one
  // process: nothing is launched).
  BucketAllreduce(Backend& backend, Communicator* comm, BucketPlan plan, common::DataType wire);
  ~BucketAllreduce();
  BucketAllreduce(const BucketAllreduce&) = delete;
  BucketAllreduce& operator=(const BucketAllreduce&) = delete;

  const BucketPlan& plan() const { return plan_; }
  common::DataType wire() const { return wire_; }
  // Multiplies every bucket by `factor` before its exchange from the next
  // launch on (1, the default: left as they are). A rank that scales its
  // loss among ranks that do not unscales its gradients so (loss_scaler.h).
  void set_prescale(float factor) { prescale_ = factor; }
  // Starts bucket `b` of `gradients` (the network's f32 gradient buffer).
  void launch(int b, float* gradients);
  void launch_all(float* gradients);
  // Waits for every launched allreduce and leaves the sums in `gradients`.
  void complete(float* gradients);

 private:
  Backend& backend_;
  Communicator* comm_;
  BucketPlan plan_;
  common::DataType wire_;
  void* staging_ = nullptr;   // the half copy of the gradients; null for f32
  std::vector<int> launched_;  // buckets in flight, in launch order
  float prescale_ = 1.0f;
};

}  // namespace vtrain::worker
