// Per-sample transforms: which window of an image becomes the network's
// input (random-resized crop, centre crop, random crop with padding),
// horizontal flip, and the resampling of that window into a batch's floats,
// normalised per channel, in NCHW.
//
// Every random choice of a sample is a pure function of (seed, epoch,
// sample index): which rank or thread renders a sample, the batch split, a
// resume or another rank count never change its pixels.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/name_table.h"

namespace vtrain::worker {

// Which window of the source image is rendered (data.*_transform.crop).
enum class CropKind {
  kNone,           // the whole image, resized to the output (squashed if the aspect differs)
  kRandomResized,  // torchvision RandomResizedCrop: random area and aspect, then resized
  kCenter,         // shorter side resized to `resize`, then the centre of the output's size
  kRandom,         // torchvision RandomCrop(size, padding): a window of the output's size from
                   // the image padded with `pad` zero pixels on every side
};
inline constexpr auto kCropKindNames = std::to_array<common::Named<CropKind>>(
    {{CropKind::kNone, "none"},
     {CropKind::kRandomResized, "random_resized"},
     {CropKind::kCenter, "center"},
     {CropKind::kRandom, "random"}});

struct TransformOptions {
  CropKind crop = CropKind::kNone;
  bool flip = false;            // mirror left-right with probability 1/2
  double scale_min = 0.08;      // random_resized: the window's share of the image's area
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;  // random_resized: the window's width / height
  double ratio_max = 4.0 / 3.0;
  int64_t pad = 4;              // random: zero pixels added on every side
  int64_t resize = 0;           // center: the shorter side's length before the crop;
                                // 0 = the output's shorter side
  // Whether a sample's pixels depend on the epoch.
  bool random() const { return flip || crop == CropKind::kRandomResized || crop == CropKind::kRandom; }
  std::string str() const;  // as the log and the docs write it
};

// What a sample's random choices are drawn from besides its index.
struct SampleDraw {
  uint64_t seed = 0;
  int64_t epoch = 0;
};

// A window of the source image, in its pixels (fractional where a scaled
// decode maps it), rendered onto the whole output; mirrored when `flip`.
struct CropWindow {
  double x = 0, y = 0, width = 0, height = 0;
  bool flip = false;
};

// The window `options` choose for sample `index` of an image of
// src_width x src_height rendered to out_width x out_height.
CropWindow plan_window(const TransformOptions& options, int64_t src_width, int64_t src_height,
                       int64_t out_width, int64_t out_height, SampleDraw draw, int64_t index);

// 8-bit pixels in any layout: pixel (x, y) of channel c is at
// data[x * x_step + y * y_step + c * c_step].
struct ImageView {
  const uint8_t* data = nullptr;
  int64_t width = 0, height = 0, channels = 0;
  int64_t x_step = 0, y_step = 0, c_step = 0;
};

// Per channel, out = pixel * scale + offset (pixel in 0..255).
struct PixelNorm {
  std::vector<float> scale, offset;
};
// (pixel / 255 - mean) / stddev; a channel with stddev 0 is only centred.
PixelNorm pixel_norm(const std::vector<float>& mean, const std::vector<float>& stddev);

// Buffers a thread reuses from one sample to the next (no allocation once
// they have grown to the largest sample).
struct ResampleScratch {
  std::vector<int32_t> first_x, first_y;  // per output column / row: its first source pixel
  std::vector<int32_t> taps_x, taps_y;    // and how many follow
  std::vector<float> weights_x, weights_y;
  std::vector<float> rows;  // the horizontal pass: source rows x channels x output width
};

// Renders `window` of `src` into `dst` (src.channels x out_height x
// out_width floats, NCHW) with bilinear filtering that widens its support
// when shrinking (antialiased, as Pillow's resize), normalised by `norm`.
// Pixels outside the source are 0 (before normalisation), as torchvision's
// zero padding. A window of the output's size at integer offsets copies
// pixels exactly.
void render_window(const ImageView& src, const CropWindow& window, const PixelNorm& norm,
                   int64_t out_height, int64_t out_width, float* dst, ResampleScratch& scratch);

}  // namespace vtrain::worker
