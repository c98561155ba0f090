#include "memory/device_pool.h"

#include <cstdio>
#include <limits>

#include "common/text.h"
#include "memory/memory_error.h"

namespace vtrain::memory {

Planner parse_planner(const std::string& name) {
  return common::parse_named<MemoryError>(kPlannerNames, name, "memory planner");
}

DevicePool::DevicePool(worker::Backend& backend, size_t reservation,
                       const DevicePoolOptions& options)
    : backend_(backend), options_(options), free_(align_up(reservation)) {
  if (free_.capacity() == 0) return;
  try {
    base_ = static_cast<char*>(backend.allocate_device(free_.capacity()));
  } catch (const worker::BackendError& e) {
    throw OutOfMemoryError("device memory pool: cannot reserve " +
                           common::format_bytes_fixed(free_.capacity()) + " (" +
                           std::to_string(free_.capacity()) + " bytes): " + e.what());
  }
}

DevicePool::~DevicePool() {
  if (base_) backend_.free_device(base_);
}

void* DevicePool::allocate(size_t bytes, const std::string& name) {
  const size_t size = block_bytes(bytes);
  std::optional<size_t> offset;
  int trace_id = -1;
  if (in_step_) {
    trace_id = recorder_.allocate(size);
    if (options_.planner == Planner::kStatic && report_.active && !deviated_) {
      const auto k = static_cast<size_t>(trace_id);
      if (k >= plan_.size() || size > plan_sizes_[k]) {
        deviated_ = grew_ = true;  // Sec. 4.3: larger than recorded, re-plan at step end
      } else if (free_.allocate_at(step_base_ + plan_[k], size)) {
        offset = step_base_ + plan_[k];
      } else {
        deviated_ = true;
      }
    }
  }
  if (!offset) offset = free_.allocate(size);
  if (!offset) {
    if (trace_id >= 0) recorder_.release(trace_id);
    throw OutOfMemoryError(
        "device memory pool: out of memory allocating '" + name + "' (" + common::format_bytes_fixed(bytes) +
        " = " + std::to_string(bytes) + " bytes): " + common::format_bytes_fixed(free_.bytes_in_use()) +
        " in use of a " + common::format_bytes_fixed(free_.capacity()) + " pool, largest free range " +
        common::format_bytes_fixed(free_.largest_free()) +
        (options_.capacity_note.empty() ? "" : " (" + options_.capacity_note + ")"));
  }
  if (in_step_ && *offset + size > step_base_) {
    step_span_ = std::max(step_span_, *offset + size - step_base_);
  }
  void* ptr = base_ + *offset;
  blocks_[ptr] = {*offset, name, trace_id};
  peak_ = std::max(peak_, free_.bytes_in_use());
  if (in_step_) step_peak_ = std::max(step_peak_, free_.bytes_in_use());
  sample("alloc ", name);
  return ptr;
}

void DevicePool::release(void* ptr) {
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) {
    throw MemoryError("device memory pool: release of a pointer it did not allocate");
  }
  const Block block = std::move(it->second);
  blocks_.erase(it);
  if (in_step_ && block.trace_id >= 0) recorder_.release(block.trace_id);
  if (options_.poison_freed) {
    const auto floats = static_cast<int64_t>(free_.block_size(block.offset) / sizeof(float));
    backend_.fill(worker::Tensor{worker::vector_desc(floats), static_cast<float*>(ptr)},
                  std::numeric_limits<float>::quiet_NaN());
  }
  free_.release(block.offset);
  sample("free ", block.name);
}

void DevicePool::sample(const char* what, const std::string& name) {
  if (!in_step_) return;
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  step_area_ += static_cast<double>(last_bytes_) * (t - last_sample_);
  last_sample_ = t;
  last_bytes_ = free_.bytes_in_use();
  if (recording_) timeline_.push_back({t, last_bytes_, label_, what + name});
}

void DevicePool::begin_step() {
  if (in_step_) throw MemoryError("device memory pool: begin_step() inside a step");
  in_step_ = true;
  timeline_.clear();
  step_start_ = std::chrono::steady_clock::now();
  recorder_ = DsaTraceRecorder();
  deviated_ = grew_ = false;
  step_span_ = 0;
  last_bytes_ = step_peak_ = free_.bytes_in_use();
  step_area_ = last_sample_ = 0;
  // Planned offsets start above every block made outside steps; if more
  // were made since the plan, it no longer applies.
  if (!step_base_set_ || free_.top() > step_base_) {
    if (step_base_set_ && report_.active) {
      plan_.clear();
      report_.active = false;
    }
    step_base_ = free_.top();
    step_base_set_ = true;
  }
}

void DevicePool::plan_from_trace(const std::vector<DsaBlock>& trace, const DsaPlan& plan) {
  if (in_step_) throw MemoryError("device memory pool: plan_from_trace() inside a step");
  if (options_.planner != Planner::kStatic) return;
  step_base_ = free_.top();
  step_base_set_ = true;
  adopt_plan(trace, plan);
}

void DevicePool::end_step() {
  if (!in_step_) throw MemoryError("device memory pool: end_step() outside a step");
  last_trace_ = recorder_.finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  const double area = step_area_ + static_cast<double>(last_bytes_) * (seconds - last_sample_);
  step_average_ = seconds > 0 ? area / seconds : static_cast<double>(last_bytes_);
  for (auto& [ptr, block] : blocks_) block.trace_id = -1;  // ids are per step
  if (options_.planner == Planner::kStatic) {
    if (!report_.active) {
      report_.pool_span = step_span_;
      // The same trace as a plan that did not fit would not fit again.
      if (last_trace_ != rejected_trace_) adopt_plan(last_trace_, dsa_plan(last_trace_));
    } else if (deviated_) {
      report_.pool_span = step_span_;
      if (grew_) ++report_.replans;
      adopt_plan(last_trace_, dsa_plan(last_trace_));
    }
  }
  in_step_ = false;
}

void DevicePool::adopt_plan(const std::vector<DsaBlock>& trace, const DsaPlan& plan) {
  report_.plan_seconds = plan.seconds;
  report_.plan_peak = plan.peak;
  report_.lower_bound = dsa_lower_bound(trace);
  report_.blocks = static_cast<int>(trace.size());
  ++report_.plans;
  // A plan that does not fit the reservation is not adopted: the pool keeps
  // serving (and the next step is recorded and planned again).
  report_.active = step_base_ + report_.plan_peak <= free_.capacity();
  if (report_.active) {
    plan_ = plan.offsets;
    plan_sizes_.clear();
    for (const DsaBlock& b : trace) plan_sizes_.push_back(b.size);
  } else {
    plan_.clear();
    rejected_trace_ = trace;
  }
}

}  // namespace vtrain::memory
