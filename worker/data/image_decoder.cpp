#include "worker/data/image_decoder.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <stdexcept>
#include <string>

#include "worker/data/data.h"

namespace vtrain::worker {

// TurboJPEG 2.1 (Debian 12's libturbojpeg 2.1.5, the tj*() 2.x API) can
// scale in the DCT but cannot decode part of an image (tj3SetCroppingRegion
// came with 3.0), so images are decoded through libjpeg-turbo's libjpeg
// API, which has both: scale_num / scale_denom, jpeg_crop_scanline and
// jpeg_skip_scanlines.
//
// libjpeg reports errors through a callback that must not return: it
// longjmp()s back to the setjmp() at the top of the function that called
// into libjpeg. Those functions hold no C++ object with a destructor, so
// the jump skips none.
struct ImageDecoder::Jpeg {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  std::jmp_buf jump{};
  char message[JMSG_LENGTH_MAX] = {};

  Jpeg() {
    cinfo.err = jpeg_std_error(&err);
    err.error_exit = &on_error;
    err.emit_message = &on_message;
    cinfo.client_data = this;
    jpeg_create_decompress(&cinfo);
  }
  ~Jpeg() { jpeg_destroy_decompress(&cinfo); }

  [[noreturn]] static void fail(j_common_ptr c) {
    auto* self = static_cast<Jpeg*>(c->client_data);
    (*c->err->format_message)(c, self->message);
    std::longjmp(self->jump, 1);
  }
  static void on_error(j_common_ptr c) { fail(c); }
  // A warning (level -1) means corrupt data: libjpeg would fill the rest
  // grey and carry on. Only extraneous bytes between markers, common in
  // cameras' files and harmless, are let through.
  static void on_message(j_common_ptr c, int level) {
    if (level == -1 && c->err->msg_code != JWRN_EXTRANEOUS_DATA) fail(c);
  }
};

namespace {

// What decode_region reads and what it found.
struct JpegRegion {
  int scale = 1;
  J_COLOR_SPACE space = JCS_RGB;
  JDIMENSION x0 = 0, width = 0, y0 = 0, rows = 0;  // in scaled pixels; x0 / width adjusted to iMCUs
  int components = 0;
};

// Each returns false with jpeg.message set when libjpeg failed.
bool read_jpeg_header(jpeg_decompress_struct& cinfo, std::jmp_buf& jump, std::span<const uint8_t> bytes) {
  if (setjmp(jump)) {
    jpeg_abort_decompress(&cinfo);
    return false;
  }
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  return true;
}

bool decode_jpeg_region(jpeg_decompress_struct& cinfo, std::jmp_buf& jump, JpegRegion& r, uint8_t* out) {
  if (setjmp(jump)) {
    jpeg_abort_decompress(&cinfo);
    return false;
  }
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(r.scale);
  cinfo.out_color_space = r.space;
  jpeg_start_decompress(&cinfo);
  if (r.x0 > 0 || r.width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &r.x0, &r.width);
  r.width = cinfo.output_width;
  r.components = cinfo.output_components;
  if (r.y0 > 0) jpeg_skip_scanlines(&cinfo, r.y0);
  const size_t stride = size_t{cinfo.output_width} * static_cast<size_t>(cinfo.output_components);
  while (cinfo.output_scanline < r.y0 + r.rows) {
    JSAMPROW row = out + (cinfo.output_scanline - r.y0) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_abort_decompress(&cinfo);  // the rows below the window are not needed
  return true;
}

// Scaled size as libjpeg computes it.
JDIMENSION scaled(JDIMENSION size, int scale) {
  return (size + static_cast<JDIMENSION>(scale) - 1) / static_cast<JDIMENSION>(scale);
}

// CMYK (Adobe's files store it inverted) to RGB or grey, in place.
void convert_cmyk(uint8_t* pixels, int64_t count, int64_t channels, bool inverted) {
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* p = pixels + 4 * i;
    int v[3];
    const int k = inverted ? p[3] : 255 - p[3];
    for (int c = 0; c < 3; ++c) v[c] = ((inverted ? p[c] : 255 - p[c]) * k + 127) / 255;
    uint8_t* q = pixels + channels * i;
    if (channels == 1) {
      q[0] = static_cast<uint8_t>((v[0] * 19595 + v[1] * 38470 + v[2] * 7471 + 32768) >> 16);
    } else {
      for (int c = 0; c < 3; ++c) q[c] = static_cast<uint8_t>(v[c]);
    }
  }
}

void check_interleaved(const ImageView& image) {
  if (image.x_step != image.channels || image.c_step != 1 || image.y_step < image.width * image.channels) {
    throw std::invalid_argument("image encoding needs interleaved pixels (HWC)");
  }
}

void check_size(int64_t width, int64_t height) {
  if (width < 1 || height < 1 || width * height > ImageDecoder::kMaxPixels) {
    throw DataError("image of " + std::to_string(width) + "x" + std::to_string(height) +
                    " pixels (at most 2^28 pixels are decoded)");
  }
}

}  // namespace

ImageView interleaved(const uint8_t* data, int64_t width, int64_t height, int64_t channels) {
  return {data, width, height, channels, channels, width * channels, 1};
}

std::vector<uint8_t> encode_png(const ImageView& image) {
  check_interleaved(image);
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = image.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  std::vector<uint8_t> out;
  for (int pass = 0; pass < 2; ++pass) {  // the size, then the bytes
    if (!png_image_write_to_memory(&png, pass == 0 ? nullptr : out.data(), &size, 0, image.data,
                                   static_cast<png_int_32>(image.y_step), nullptr)) {
      throw DataError(std::string("PNG encoding failed: ") + png.message);
    }
    out.resize(size);
  }
  return out;
}

std::vector<uint8_t> encode_jpeg(const ImageView& image, int quality, bool progressive) {
  check_interleaved(image);
  struct Closer {
    void operator()(void* handle) const { tjDestroy(handle); }
  };
  const std::unique_ptr<void, Closer> handle(tjInitCompress());
  if (!handle) throw DataError(std::string("TurboJPEG: ") + tjGetErrorStr2(nullptr));
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int format = image.channels == 1 ? TJPF_GRAY : image.channels == 4 ? TJPF_CMYK : TJPF_RGB;
  const int subsampling = image.channels == 1 ? TJSAMP_GRAY : TJSAMP_420;
  if (tjCompress2(handle.get(), image.data, static_cast<int>(image.width), static_cast<int>(image.y_step),
                  static_cast<int>(image.height), format, &out, &size, subsampling, quality,
                  progressive ? TJFLAG_PROGRESSIVE : 0) != 0) {
    tjFree(out);
    throw DataError(std::string("JPEG encoding failed: ") + tjGetErrorStr2(handle.get()));
  }
  std::vector<uint8_t> bytes(out, out + size);
  tjFree(out);
  return bytes;
}

ImageFormat sniff_image(std::span<const uint8_t> bytes) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return ImageFormat::kJpeg;
  if (bytes.size() >= 8 && std::equal(kPng, kPng + 8, bytes.begin())) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

ImageDecoder::ImageDecoder() : jpeg_(std::make_unique<Jpeg>()) {}
ImageDecoder::~ImageDecoder() = default;

DecodedWindow ImageDecoder::decode(std::span<const uint8_t> bytes, int64_t channels, int64_t out_width,
                                   int64_t out_height, const Planner& plan) {
  if (channels != 1 && channels != 3) {
    throw DataError("images decode to 1 (grey) or 3 (RGB) channels, not " + std::to_string(channels));
  }
  switch (sniff_image(bytes)) {
    case ImageFormat::kJpeg:
      return decode_jpeg(bytes, channels, out_width, out_height, plan);
    case ImageFormat::kPng:
      return decode_png(bytes, channels, plan);
    case ImageFormat::kUnknown:
      break;
  }
  if (bytes.empty()) throw DataError("empty file, expected a JPEG or PNG image");
  throw DataError("not a JPEG or PNG image (by its first bytes)");
}

ImageView ImageDecoder::decode_full(std::span<const uint8_t> bytes, int64_t channels) {
  auto whole = [](int64_t w, int64_t h) { return CropWindow{0, 0, double(w), double(h)}; };
  // Asking for an output of one pixel would let a JPEG scale down: ask for
  // the largest so that it decodes at full size.
  return decode(bytes, channels, INT32_MAX, INT32_MAX, whole).view;
}

DecodedWindow ImageDecoder::decode_jpeg(std::span<const uint8_t> bytes, int64_t channels, int64_t out_width,
                                        int64_t out_height, const Planner& plan) {
  Jpeg& j = *jpeg_;
  jpeg_decompress_struct& cinfo = j.cinfo;
  if (!read_jpeg_header(cinfo, j.jump, bytes)) throw DataError(std::string("corrupt JPEG: ") + j.message);
  const int64_t width = cinfo.image_width, height = cinfo.image_height;
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  const bool inverted = cinfo.saw_Adobe_marker;
  try {
    check_size(width, height);
  } catch (...) {
    jpeg_abort_decompress(&cinfo);
    throw;
  }
  const CropWindow window = plan(width, height);

  // The largest DCT scale-down that keeps the window at least the output's size.
  JpegRegion r;
  for (int s : {8, 4, 2}) {
    if (window.width / s >= static_cast<double>(out_width) &&
        window.height / s >= static_cast<double>(out_height)) {
      r.scale = s;
      break;
    }
  }
  const JDIMENSION full_w = scaled(static_cast<JDIMENSION>(width), r.scale);
  const JDIMENSION full_h = scaled(static_cast<JDIMENSION>(height), r.scale);
  auto clamp = [](double v, JDIMENSION hi) {
    return static_cast<JDIMENSION>(std::clamp(v, 0.0, static_cast<double>(hi)));
  };
  r.x0 = clamp(std::floor(window.x / r.scale), full_w);
  r.width = clamp(std::ceil((window.x + window.width) / r.scale), full_w) - r.x0;
  r.y0 = clamp(std::floor(window.y / r.scale), full_h);
  r.rows = clamp(std::ceil((window.y + window.height) / r.scale), full_h) - r.y0;
  if (r.width == 0 || r.rows == 0) {  // a window beside the image: all zero padding
    r.x0 = r.y0 = 0;
    r.width = std::min<JDIMENSION>(full_w, 1);
    r.rows = std::min<JDIMENSION>(full_h, 1);
  }
  r.space = cmyk ? JCS_CMYK : channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  pixels_.resize(size_t{full_w} * r.rows * (cmyk ? 4 : static_cast<size_t>(channels)));
  if (!decode_jpeg_region(cinfo, j.jump, r, pixels_.data())) {
    throw DataError(std::string("corrupt JPEG: ") + j.message);
  }
  if (cmyk) convert_cmyk(pixels_.data(), int64_t{r.width} * r.rows, channels, inverted);

  DecodedWindow out;
  out.view = interleaved(pixels_.data(), r.width, r.rows, channels);
  out.window = {window.x / r.scale - r.x0, window.y / r.scale - r.y0, window.width / r.scale,
                window.height / r.scale, window.flip};
  out.scale = r.scale;
  out.full_width = width;
  out.full_height = height;
  return out;
}

DecodedWindow ImageDecoder::decode_png(std::span<const uint8_t> bytes, int64_t channels,
                                       const Planner& plan) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    throw DataError(std::string("corrupt PNG: ") + image.message);
  }
  try {
    check_size(image.width, image.height);
  } catch (...) {
    png_image_free(&image);
    throw;
  }
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  pixels_.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, pixels_.data(), 0, nullptr)) {
    throw DataError(std::string("corrupt PNG: ") + image.message);  // finish_read freed it
  }
  DecodedWindow out;
  out.full_width = image.width;
  out.full_height = image.height;
  out.view = interleaved(pixels_.data(), image.width, image.height, channels);
  out.window = plan(image.width, image.height);
  return out;
}

}  // namespace vtrain::worker
