// pack_shards: a dataset into WebDataset tar shards with an index each.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "worker/data/gather.h"
#include "worker/data/image_files.h"
#include "worker/data/tar_file.h"

namespace vtrain::worker {
namespace {

// Re-encodes JPEGs larger than max_side (TurboJPEG's tjCompress2), keeping
// the aspect ratio; 4:2:0 as cameras and ImageNet's files are.
class JpegShrinker {
 public:
  JpegShrinker(int64_t max_side, int quality) : max_side_(max_side), quality_(quality) {}

  // True when `bytes` was replaced by a smaller image.
  bool shrink(std::vector<uint8_t>& bytes) {
    if (max_side_ <= 0 || sniff_image(bytes) != ImageFormat::kJpeg) return false;
    const ImageView full = decoder_.decode_full(bytes, 3);
    const int64_t side = std::max(full.width, full.height);
    if (side <= max_side_) return false;
    const double f = static_cast<double>(max_side_) / static_cast<double>(side);
    const int64_t w = std::max<int64_t>(1, std::lround(full.width * f));
    const int64_t h = std::max<int64_t>(1, std::lround(full.height * f));
    planar_.resize(static_cast<size_t>(3 * w * h));
    const PixelNorm identity{{1, 1, 1}, {0, 0, 0}};
    render_window(full, {0, 0, double(full.width), double(full.height)}, identity, h, w, planar_.data(),
                  scratch_);
    pixels_.resize(planar_.size());
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t j = 0; j < w * h; ++j) {
        pixels_[j * 3 + c] = static_cast<uint8_t>(std::clamp(std::lround(planar_[c * w * h + j]), 0L, 255L));
      }
    }
    bytes = encode_jpeg(interleaved(pixels_.data(), w, h, 3), quality_);
    return true;
  }

 private:
  int64_t max_side_;
  int quality_;
  ImageDecoder decoder_;
  ResampleScratch scratch_;
  std::vector<float> planar_;
  std::vector<uint8_t> pixels_;
};

// Sample i's bytes as stored in a shard and their extension.
class SampleEncoder {
 public:
  SampleEncoder(const Dataset& data, const PackOptions& o) : data_(data), shrinker_(o.max_side, o.quality) {}

  const char* encode(int64_t i, std::vector<uint8_t>& bytes, bool& resized) {
    resized = false;
    if (!data_.files) {
      const Shape& s = data_.sample;
      const int64_t plane = s.h * s.w;
      hwc_.resize(static_cast<size_t>(s.c * plane));
      const uint8_t* src = data_.pixels.data() + i * s.c * plane;
      for (int64_t c = 0; c < s.c; ++c) {
        for (int64_t j = 0; j < plane; ++j) hwc_[j * s.c + c] = src[c * plane + j];
      }
      bytes = encode_png(interleaved(hwc_.data(), s.w, s.h, s.c));
      return ".png";
    }
    data_.files->read(i, bytes);
    try {
      resized = shrinker_.shrink(bytes);
    } catch (const DataError& e) {
      throw DataError(data_.files->describe(i) + ": " + e.what());
    }
    const ImageFormat format = sniff_image(bytes);
    if (format == ImageFormat::kUnknown)
      throw DataError(data_.files->describe(i) + ": not a JPEG or PNG image");
    return format == ImageFormat::kJpeg ? ".jpg" : ".png";
  }

 private:
  const Dataset& data_;
  JpegShrinker shrinker_;
  std::vector<uint8_t> hwc_;
};

std::string shard_path(const std::string& prefix, int64_t number) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "-%06lld.tar", static_cast<long long>(number));
  return prefix + digits;
}

}  // namespace

PackResult pack_shards(const Dataset& data, const PackOptions& o) {
  if (o.samples_per_shard < 1) throw DataError("pack: samples per shard must be at least 1");
  if (data.count == 0) throw DataError("pack: the dataset is empty");
  if (data.files == nullptr && data.sample.c != 1 && data.sample.c != 3) {
    throw DataError("pack: in-memory samples of " + std::to_string(data.sample.c) +
                    " channels (1 or 3 are stored)");
  }
  SampleEncoder encoder(data, o);
  PackResult result;
  std::vector<uint8_t> bytes;
  for (int64_t first = 0, number = 0; first < data.count; first += o.samples_per_shard, ++number) {
    const std::string path = shard_path(o.out_prefix, number);
    const std::string temporary = path + ".tmp";
    std::vector<ShardSample> samples;
    TarWriter tar(temporary);
    for (int64_t i = first; i < std::min(data.count, first + o.samples_per_shard); ++i) {
      bool resized = false;
      const char* ext = encoder.encode(i, bytes, resized);
      char key[32];
      std::snprintf(key, sizeof key, "%09lld", static_cast<long long>(i));
      const int32_t label = data.labels[static_cast<size_t>(i)];
      const int64_t offset = tar.add(key + std::string(ext), bytes);
      const std::string cls = std::to_string(label);
      tar.add(key + std::string(".cls"), {reinterpret_cast<const uint8_t*>(cls.data()), cls.size()});
      samples.push_back({offset, static_cast<int64_t>(bytes.size()), label, key + std::string(ext)});
      result.resized += resized ? 1 : 0;
    }
    const int64_t size = tar.finish();
    std::filesystem::rename(temporary, path);
    write_shard_index(path, size, samples);
    result.shards.push_back(path);
    result.samples += static_cast<int64_t>(samples.size());
    result.bytes += size;
  }
  return result;
}

}  // namespace vtrain::worker
