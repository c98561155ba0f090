// Decoding JPEG (libjpeg-turbo) and PNG (libpng) images, told apart by
// their content, into 8-bit grey or RGB pixels, decoding only what a crop
// window needs where the format allows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "worker/data/transform.h"

namespace vtrain::worker {

enum class ImageFormat { kUnknown, kJpeg, kPng };

// The format the first bytes say (JPEG: FF D8 FF; PNG: its 8-byte signature).
ImageFormat sniff_image(std::span<const uint8_t> bytes);

// Interleaved (HWC) pixels as a view.
ImageView interleaved(const uint8_t* data, int64_t width, int64_t height, int64_t channels);

// An interleaved grey or RGB image as PNG file bytes (libpng).
std::vector<uint8_t> encode_png(const ImageView& image);
// An interleaved grey, RGB or CMYK (4 channels) image as JPEG file bytes
// (TurboJPEG's tjCompress2; colour 4:2:0), baseline or progressive.
std::vector<uint8_t> encode_jpeg(const ImageView& image, int quality, bool progressive = false);

// A decoded region of an image and the requested window in its pixels.
struct DecodedWindow {
  ImageView view;       // HWC, valid until the decoder's next call
  CropWindow window;    // the planned window, in the view's pixels
  int64_t scale = 1;    // the image was decoded at 1/scale (DCT scaling)
  int64_t full_width = 0, full_height = 0;  // the image's own size
};

// Decodes images with buffers it reuses (one decoder per thread; not
// thread-safe). Errors are DataError without the file's name (the caller
// knows it and adds it).
class ImageDecoder {
 public:
  // Images with more pixels are refused (a corrupt header could ask for any size).
  static constexpr int64_t kMaxPixels = int64_t{1} << 28;
  // Asked for the window of the full-size image of (width, height) to render.
  using Planner = std::function<CropWindow(int64_t width, int64_t height)>;

  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Reads the header, asks `plan` for the window to render at out_width x
  // out_height, and decodes with `channels` channels (1: grey, 3: RGB; CMYK
  // JPEGs are converted) what that window needs. A JPEG is decoded at 1/2,
  // 1/4 or 1/8 scale in the DCT when the window stays at least the output's
  // size there, and only the window's rows (libjpeg's jpeg_skip_scanlines)
  // and columns (jpeg_crop_scanline). Corrupt or truncated data in what is
  // decoded, a warning of libjpeg (other than extraneous bytes between
  // markers) and any other format are DataError.
  DecodedWindow decode(std::span<const uint8_t> bytes, int64_t channels, int64_t out_width,
                       int64_t out_height, const Planner& plan);

  // The whole image at full size.
  ImageView decode_full(std::span<const uint8_t> bytes, int64_t channels);

 private:
  struct Jpeg;
  DecodedWindow decode_jpeg(std::span<const uint8_t> bytes, int64_t channels, int64_t out_width,
                            int64_t out_height, const Planner& plan);
  DecodedWindow decode_png(std::span<const uint8_t> bytes, int64_t channels, const Planner& plan);

  std::unique_ptr<Jpeg> jpeg_;
  std::vector<uint8_t> pixels_;
};

}  // namespace vtrain::worker
