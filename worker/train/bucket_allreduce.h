// The gradient allreduce of a data-parallel step: buckets launched while
// backward runs, completed before the update, in f32 or in the job's half
// type (train.gradient_allreduce).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/name_table.h"
#include "common/precision.h"
#include "worker/comm/communicator.h"
#include "worker/device/backend.h"
#include "worker/train/gradient_buckets.h"

namespace vtrain::worker {

// train.gradient_allreduce: the type gradient buckets travel in. kHalf is
// the job's half type (bf16 or fp16), so it needs a half train.precision.
enum class GradientAllreduce { kFp32, kHalf };
inline constexpr auto kGradientAllreduceNames = std::to_array<common::Named<GradientAllreduce>>(
    {{GradientAllreduce::kFp32, "fp32"}, {GradientAllreduce::kHalf, "half"}});

// The type buckets travel in: f32, or for kHalf the half type of
// `precision`. Throws std::invalid_argument naming train.gradient_allreduce
// for kHalf under fp32 or tf32.
common::DataType wire_type(GradientAllreduce type, common::Precision precision);
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
};

}  // namespace vtrain::worker
