#include "worker/data/gather.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "worker/data/image_files.h"

namespace vtrain::worker {
namespace {

void check_index(const Dataset& data, int64_t index) {
  if (index < 0 || index >= data.count) {
    throw std::out_of_range("gather: sample index " + std::to_string(index) + " outside [0, " +
                            std::to_string(data.count) + ")");
  }
}

// An in-memory sample (NCHW bytes) as an image view.
ImageView stored_view(const Dataset& data, int64_t index) {
  const Shape& s = data.sample;
  const int64_t plane = s.h * s.w;
  return {data.pixels.data() + index * s.c * plane, s.w, s.h, s.c, 1, s.w, plane};
}

void render_file(const Dataset& data, int64_t index, const PixelNorm& norm, SampleDraw draw, float* image,
                 SampleScratch& scratch) {
  const Shape& s = data.sample;
  data.files->read(index, scratch.bytes);
  // One reference captured: the planner fits std::function's own storage,
  // so no allocation per sample.
  const struct {
    const Dataset& data;
    SampleDraw draw;
    int64_t index;
  } sample{data, draw, index};
  try {
    const DecodedWindow decoded =
        scratch.decoder.decode(scratch.bytes, s.c, s.w, s.h, [&sample](int64_t width, int64_t height) {
          const Shape& out = sample.data.sample;
          return plan_window(sample.data.transform, width, height, out.w, out.h, sample.draw, sample.index);
        });
    render_window(decoded.view, decoded.window, norm, s.h, s.w, image, scratch.resample);
  } catch (const DataError& e) {
    throw DataError(data.files->describe(index) + ": " + e.what());
  }
}

}  // namespace

bool transforms_samples(const Dataset& data) {
  return data.files != nullptr || data.transform.crop != CropKind::kNone || data.transform.flip;
}

void gather_sample(const Dataset& data, int64_t index, const PixelNorm& norm, SampleDraw draw, float* image,
                   int32_t* label, SampleScratch& scratch) {
  check_index(data, index);
  *label = data.labels[static_cast<size_t>(index)];
  if (data.files) {
    render_file(data, index, norm, draw, image, scratch);
    return;
  }
  const Shape& s = data.sample;
  const CropWindow window = plan_window(data.transform, s.w, s.h, s.w, s.h, draw, index);
  render_window(stored_view(data, index), window, norm, s.h, s.w, image, scratch.resample);
}

void gather_batch(const Dataset& data, std::span<const int64_t> indices, const ChannelStats& norm,
                  SampleDraw draw, float* images, int32_t* labels) {
  if (!transforms_samples(data)) {
    gather_batch(data, indices, norm, images, labels);
    return;
  }
  thread_local SampleScratch scratch;
  const PixelNorm pixels = pixel_norm(norm.mean, norm.stddev);
  if (static_cast<int64_t>(pixels.scale.size()) != data.sample.c) {
    throw std::invalid_argument("gather_batch: normalisation has " + std::to_string(pixels.scale.size()) +
                                " channels, the samples " + std::to_string(data.sample.c));
  }
  const int64_t per_sample = data.sample.per_sample();
  for (size_t b = 0; b < indices.size(); ++b) {
    gather_sample(data, indices[b], pixels, draw, images + static_cast<int64_t>(b) * per_sample, labels + b,
                  scratch);
  }
}

ChannelStats file_channel_stats(const Dataset& data) {
  const int64_t n = std::min(data.count, kStatsSamples);
  const int64_t channels = data.sample.c, plane = data.sample.h * data.sample.w;
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[i] = i * data.count / n;
  const ChannelStats unit{std::vector<float>(channels, 0.0f), std::vector<float>(channels, 1.0f)};
  std::vector<float> image(static_cast<size_t>(channels * plane));
  std::vector<double> sum(channels, 0.0), squares(channels, 0.0);
  int32_t label = 0;
  for (int64_t index : indices) {
    gather_batch(data, {&index, 1}, unit, SampleDraw{}, image.data(), &label);
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t j = 0; j < plane; ++j) {
        const double v = image[c * plane + j];
        sum[c] += v;
        squares[c] += v * v;
      }
    }
  }
  ChannelStats stats;
  const double count = static_cast<double>(n * plane);
  for (int64_t c = 0; c < channels; ++c) {
    const double mean = sum[c] / count;
    stats.mean.push_back(static_cast<float>(mean));
    stats.stddev.push_back(static_cast<float>(std::sqrt(std::max(0.0, squares[c] / count - mean * mean))));
  }
  return stats;
}

}  // namespace vtrain::worker
