#include "worker/data/decode_pool.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "worker/data/image_files.h"

namespace vtrain::worker {

int default_decode_workers(bool cpu_backend, int hardware_threads, int compute_threads, int ranks_on_host) {
  const int share = std::max(1, hardware_threads / std::max(1, ranks_on_host));
  return std::max(1, share - (cpu_backend ? compute_threads : 1));
}

DecodePool::DecodePool(int workers) {
  if (workers < 1)
    throw std::invalid_argument("DecodePool: workers must be >= 1, got " + std::to_string(workers));
  for (int w = 0; w < workers; ++w) scratch_.push_back(std::make_unique<SampleScratch>());
  for (int w = 0; w < workers; ++w) threads_.emplace_back([this, w] { run(w); });
}

DecodePool::~DecodePool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& t : threads_) t.join();
}

namespace {

// The positions of `indices` in the order their bytes lie in the storage
// (ImageFiles::location), into `order`; as given for data in memory.
void read_order(const Dataset& data, std::span<const int64_t> indices, std::vector<int32_t>& order) {
  order.resize(indices.size());
  std::iota(order.begin(), order.end(), 0);
  if (!data.files) return;
  const ImageFiles& files = *data.files;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return files.location(indices[a]) < files.location(indices[b]);
  });
}

}  // namespace

void DecodePool::gather(const Dataset& data, std::span<const int64_t> indices, const PixelNorm& norm,
                        SampleDraw draw, float* images, int32_t* labels) {
  std::lock_guard serial(gather_mutex_);
  const auto start = std::chrono::steady_clock::now();
  read_order(data, indices, order_);
  std::unique_lock lock(mutex_);
  job_ = {&data, indices, order_, &norm, draw, images, labels};
  next_sample_ = 0;
  busy_ = workers();
  error_ = nullptr;
  ++generation_;
  work_ready_.notify_all();
  work_done_.wait(lock, [&] { return busy_ == 0; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  images_ += static_cast<int64_t>(indices.size());
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

InputRate DecodePool::measured_rate() const {
  std::lock_guard lock(mutex_);
  return {seconds_ > 0 ? static_cast<double>(images_) / seconds_ : 0.0, images_, seconds_, workers()};
}

// Each worker claims samples one at a time until the job has none left, so
// a slow image holds up one thread, not a fixed share of the batch.
void DecodePool::run(int worker) {
  SampleScratch& scratch = *scratch_[worker];
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const Job job = job_;
    const int64_t per_sample = job.data->sample.per_sample();
    const auto count = static_cast<int64_t>(job.indices.size());
    while (next_sample_ < count && !error_) {
      const int64_t b = job.order[static_cast<size_t>(next_sample_++)];
      lock.unlock();
      try {
        gather_sample(*job.data, job.indices[b], *job.norm, job.draw, job.images + b * per_sample,
                      job.labels + b, scratch);
        lock.lock();
      } catch (...) {
        lock.lock();
        if (!error_) error_ = std::current_exception();
      }
    }
    if (--busy_ == 0) work_done_.notify_all();
  }
}

}  // namespace vtrain::worker
