#include "launcher/data_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "worker/data/decode_pool.h"
#include "worker/data/image_files.h"

namespace vtrain::launcher {
namespace {

int pack(const CliArgs& cli, const worker::Dataset& data) {
  const auto start = std::chrono::steady_clock::now();
  const worker::PackResult r = worker::pack_shards(data, {.out_prefix = cli.out,
                                                          .samples_per_shard = cli.shard_samples,
                                                          .max_side = cli.max_side,
                                                          .quality = cli.quality});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "data pack: %lld samples into %zu shard(s) %s ... %s (%.1f MiB, %lld resized to at most %lld px) "
      "in %.1f s\n",
      static_cast<long long>(r.samples), r.shards.size(), r.shards.front().c_str(), r.shards.back().c_str(),
      static_cast<double>(r.bytes) / (1 << 20), static_cast<long long>(r.resized),
      static_cast<long long>(cli.max_side), seconds);
  return kExitOk;
}

// The first batch warms the workers' buffers and is not timed.
int bench(const CliArgs& cli, const worker::Dataset& data, int64_t batch, int workers) {
  batch = std::min(batch, data.count);
  worker::DecodePool pool(workers);
  const int64_t channels = data.sample.c;
  // The values do not change the work: a fixed normalisation.
  const worker::PixelNorm norm =
      worker::pixel_norm(std::vector<float>(channels, 0.5f), std::vector<float>(channels, 0.25f));
  std::vector<float> images(static_cast<size_t>(batch * data.sample.per_sample()));
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  const std::vector<int64_t> order = worker::epoch_permutation(1, 0, data.count);
  auto run = [&](int64_t b) {
    std::vector<int64_t> indices(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) indices[i] = order[(b * batch + i) % data.count];
    pool.gather(data, indices, norm, {1, b * batch / data.count}, images.data(), labels.data());
  };
  run(0);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t b = 1; b <= cli.batches; ++b) run(b);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double images_per_second = static_cast<double>(cli.batches * batch) / seconds;
  std::printf(
      "data bench: %lld images (%lld batches of %lld) of %s, transform %s, %d worker(s): %.1f img/s "
      "(%.1f per worker)\n",
      static_cast<long long>(cli.batches * batch), static_cast<long long>(cli.batches),
      static_cast<long long>(batch), data.sample.str().c_str(), data.transform.str().c_str(), workers,
      images_per_second, images_per_second / workers);
  return kExitOk;
}

}  // namespace

int run_data(const CliArgs& cli, const worker::Dataset& data, int64_t batch, int workers) {
  if (cli.data_action == "pack") return pack(cli, data);
  return bench(cli, data, batch, workers);
}

}  // namespace vtrain::launcher
