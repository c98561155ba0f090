// A pool of decoding threads per rank: the samples of a batch are read,
// decoded and transformed by several threads at once, each with buffers it
// reuses (no allocation per sample once they have grown), and the pool
// measures the images per second it delivers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "worker/data/data.h"
#include "worker/data/gather.h"

namespace vtrain::worker {

// What a decoding pool delivers: the input rate the batch split can weigh
// against a rank's compute (images / second of pool time).
struct InputRate {
  double images_per_second = 0;  // 0 until a batch was gathered
  int64_t images = 0;            // gathered so far
  double seconds = 0;            // wall time spent gathering them
  int workers = 0;               // threads of the pool
};

// The default of data.workers: on the CPU backend the cores the compute
// does not use (at least 1); on a GPU every core of the rank's share but
// one, which runs the training loop.
int default_decode_workers(bool cpu_backend, int hardware_threads, int compute_threads, int ranks_on_host);

class DecodePool {
 public:
  explicit DecodePool(int workers);  // workers >= 1
  ~DecodePool();
  DecodePool(const DecodePool&) = delete;
  DecodePool& operator=(const DecodePool&) = delete;

  int workers() const { return static_cast<int>(threads_.size()); }

  // Gathers samples `indices` of `data` (gather_sample) into `images` and
  // `labels`, spread over the workers; returns when all are written. Image
  // files are read in storage order (ImageFiles::location: a shard front
  // to back), whatever the batch's order: the order a sample is decoded in
  // never changes its pixels, and a shard on NFS or a disk is read ahead.
  // Rethrows the first failure (a DataError names the file). One gather at
  // a time (calls from several threads are serialised).
  void gather(const Dataset& data, std::span<const int64_t> indices, const PixelNorm& norm,
              SampleDraw draw, float* images, int32_t* labels);

  // The images per second of the gathers so far (thread-safe).
  InputRate measured_rate() const;

 private:
  struct Job {
    const Dataset* data = nullptr;
    std::span<const int64_t> indices;
    std::span<const int32_t> order;  // positions in `indices`, in the order they are claimed
    const PixelNorm* norm = nullptr;
    SampleDraw draw;
    float* images = nullptr;
    int32_t* labels = nullptr;
  };
  void run(int worker);

  std::mutex gather_mutex_;  // one gather at a time
  mutable std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  Job job_;
  uint64_t generation_ = 0;   // bumps with each job
  int64_t next_sample_ = 0;   // the job's next unclaimed sample
  int busy_ = 0;              // workers still on the job
  std::exception_ptr error_;
  bool stopping_ = false;
  int64_t images_ = 0;
  double seconds_ = 0;
  std::vector<int32_t> order_;  // the job's claim order (reused: no allocation per batch)
  std::vector<std::unique_ptr<SampleScratch>> scratch_;
  std::vector<std::thread> threads_;  // last: started once the rest exists
};

}  // namespace vtrain::worker
