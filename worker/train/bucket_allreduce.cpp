#include "worker/train/bucket_allreduce.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace vtrain::worker {
namespace {

int64_t gradient_count(const BucketPlan& plan) {
  int64_t count = 0;
  for (const Bucket& b : plan.buckets) count = std::max(count, b.offset + b.count);
  return count;
}

}  // namespace

common::DataType wire_type(GradientAllreduce type, std::span<const common::Precision> ranks) {
  if (type == GradientAllreduce::kFp32 || ranks.empty()) return common::DataType::kF32;
  const common::DataType first = common::storage_type(ranks.front());
  const bool shared = std::all_of(ranks.begin(), ranks.end(), [&](common::Precision p) {
    return common::storage_type(p) == first;
  });
  if (!shared) return common::DataType::kF32;
  if (first == common::DataType::kF32) {
    throw std::invalid_argument(
        std::string("train.gradient_allreduce: half needs a half train.precision (bf16 or "
                    "fp16), got ") + common::precision_name(ranks.front()));
  }
  return first;
}

size_t staging_bytes_per_parameter(common::DataType wire, int ranks) {
  return wire != common::DataType::kF32 && ranks > 1 ? element_bytes(wire) : 0;
}

BucketAllreduce::BucketAllreduce(Backend& backend, Communicator* comm, BucketPlan plan,
                                 common::DataType wire)
    : backend_(backend), comm_(comm), plan_(std::move(plan)), wire_(wire) {
  if (const size_t bytes = staging_bytes_per_parameter(wire_, comm_ ? comm_->size() : 1)) {
    staging_ = backend_.allocate_device(
        static_cast<size_t>(std::max<int64_t>(gradient_count(plan_), 1)) * bytes);
  }
}

BucketAllreduce::~BucketAllreduce() {
  if (staging_ != nullptr) backend_.free_device(staging_);
}

void BucketAllreduce::launch(int b, float* gradients) {
  const Bucket& bucket = plan_.buckets[static_cast<size_t>(b)];
  float* sums = gradients + bucket.offset;
  launched_.push_back(b);
  if (prescale_ != 1.0f && bucket.count > 0) backend_.run(ScaleDesc{bucket.count, prescale_}, ScaleArgs{sums});
  if (staging_ == nullptr || bucket.count == 0) {
    comm_->allreduce_async(sums, bucket.count);
    return;
  }
  void* staged = static_cast<char*>(staging_) + bucket.offset * element_bytes(wire_);
  backend_.convert(Tensor{vector_desc(bucket.count), sums},
                   Tensor{vector_desc(bucket.count, wire_), staged});
  comm_->allreduce_async(staged, bucket.count, wire_);
}

void BucketAllreduce::launch_all(float* gradients) {
  for (int b = 0; b < static_cast<int>(plan_.buckets.size()); ++b) launch(b, gradients);
}

void BucketAllreduce::complete(float* gradients) {
  if (comm_ == nullptr) return;
  comm_->wait();
  if (staging_ != nullptr) {
    for (int b : launched_) {
      const Bucket& bucket = plan_.buckets[static_cast<size_t>(b)];
      if (bucket.count == 0) continue;
      void* staged = static_cast<char*>(staging_) + bucket.offset * element_bytes(wire_);
      backend_.convert(Tensor{vector_desc(bucket.count, wire_), staged},
                       Tensor{vector_desc(bucket.count), gradients + bucket.offset});
    }
  }
  launched_.clear();
}

}  // namespace vtrain::worker
