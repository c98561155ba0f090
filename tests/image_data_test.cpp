// Image data (ctest label cpu): decoding JPEG and PNG (colour, grey, CMYK,
// progressive; DCT scaling and partial decodes against full decodes), the
// transforms and their determinism, image folders, list files, tar shards
// and their index, `pack_shards`, the decoding pool, and a fuzz of truncated
// and corrupted files that must each be a DataError naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "worker/data/data.h"
#include "worker/data/decode_pool.h"
#include "worker/data/gather.h"
#include "worker/data/image_decoder.h"
#include "worker/data/image_files.h"
#include "worker/data/tar_file.h"
#include "worker/data/transform.h"

namespace vtrain::worker {
namespace {

namespace fs = std::filesystem;

// A smooth test picture (gradients and a disc) that JPEG keeps well, HWC.
std::vector<uint8_t> picture(int64_t width, int64_t height, int64_t channels, int seed = 0) {
  std::vector<uint8_t> p(static_cast<size_t>(width * height * channels));
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      const double dx = static_cast<double>(x) - width / 2.0, dy = static_cast<double>(y) - height / 2.0;
      const bool disc = dx * dx + dy * dy < (width * height) / 10.0;
      for (int64_t c = 0; c < channels; ++c) {
        const double v =
            disc ? 200 - 40 * c : (255.0 * x / width + 80.0 * c + 30.0 * seed) * 0.5 + 60.0 * y / height;
        p[(y * width + x) * channels + c] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return p;
}

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Copies a view's pixels (they live in the decoder until its next call).
std::vector<uint8_t> pixels_of(const ImageView& v) {
  std::vector<uint8_t> out;
  for (int64_t y = 0; y < v.height; ++y) {
    for (int64_t x = 0; x < v.width; ++x) {
      for (int64_t c = 0; c < v.channels; ++c)
        out.push_back(v.data[x * v.x_step + y * v.y_step + c * v.c_step]);
    }
  }
  return out;
}

double max_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
  return d;
}

double mean_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::abs(double(a[i]) - double(b[i]));
  return d / static_cast<double>(a.size());
}

const PixelNorm kRaw3{{1, 1, 1}, {0, 0, 0}};  // pixels as they are (0..255)

// ---- decoding

TEST(ImageDecode, PngIsLosslessInGreyAndRgb) {
  ImageDecoder decoder;
  for (int64_t channels : {1, 3}) {
    const std::vector<uint8_t> p = picture(37, 23, channels);
    const std::vector<uint8_t> png = encode_png(interleaved(p.data(), 37, 23, channels));
    EXPECT_EQ(sniff_image(png), ImageFormat::kPng);
    const ImageView v = decoder.decode_full(png, channels);
    EXPECT_EQ(v.width, 37);
    EXPECT_EQ(v.height, 23);
    EXPECT_EQ(pixels_of(v), p) << channels << " channels";
  }
}

TEST(ImageDecode, JpegBaselineProgressiveGreyAndCmykDecodeCloseToTheSource) {
  ImageDecoder decoder;
  const std::vector<uint8_t> rgb = picture(64, 48, 3);
  for (bool progressive : {false, true}) {
    const std::vector<uint8_t> jpeg = encode_jpeg(interleaved(rgb.data(), 64, 48, 3), 95, progressive);
    EXPECT_EQ(sniff_image(jpeg), ImageFormat::kJpeg);
    const ImageView v = decoder.decode_full(jpeg, 3);
    ASSERT_EQ(v.width, 64);
    ASSERT_EQ(v.height, 48);
    std::vector<float> a(rgb.begin(), rgb.end());
    const std::vector<uint8_t> got = pixels_of(v);
    EXPECT_LT(mean_difference(a, std::vector<float>(got.begin(), got.end())), 3.0)
        << "progressive " << progressive;
  }
  // Grey JPEG to grey and to RGB (three equal channels).
  const std::vector<uint8_t> grey = picture(40, 40, 1);
  const std::vector<uint8_t> grey_jpeg = encode_jpeg(interleaved(grey.data(), 40, 40, 1), 95);
  const std::vector<uint8_t> as_grey = pixels_of(decoder.decode_full(grey_jpeg, 1));
  EXPECT_LT(max_difference(as_grey, grey), 12);
  const std::vector<uint8_t> as_rgb = pixels_of(decoder.decode_full(grey_jpeg, 3));
  for (size_t i = 0; i < as_grey.size(); ++i) {
    ASSERT_EQ(as_rgb[3 * i], as_grey[i]);
    ASSERT_EQ(as_rgb[3 * i + 2], as_grey[i]);
  }
  // CMYK (TurboJPEG writes YCCK with an Adobe marker, whose convention
  // stores ink inverted, as Photoshop and Pillow do): no C, M or Y ink and
  // K ink 255 - v, stored as 255 and v, is grey v.
  std::vector<uint8_t> cmyk(40 * 40 * 4, 255);
  for (size_t i = 0; i < grey.size(); ++i) cmyk[4 * i + 3] = grey[i];
  const std::vector<uint8_t> cmyk_jpeg = encode_jpeg(interleaved(cmyk.data(), 40, 40, 4), 95);
  const std::vector<uint8_t> from_cmyk = pixels_of(decoder.decode_full(cmyk_jpeg, 1));
  std::vector<float> expected(grey.begin(), grey.end());
  EXPECT_LT(mean_difference(expected, std::vector<float>(from_cmyk.begin(), from_cmyk.end())), 4.0);
}

// A window of a JPEG decoded alone (its rows skipped to, its columns
// cropped) renders as the same window of the whole image does.
TEST(ImageDecode, AWindowDecodedAloneMatchesTheWholeImage) {
  const std::vector<uint8_t> rgb = picture(320, 240, 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(interleaved(rgb.data(), 320, 240, 3), 90);
  ImageDecoder decoder;
  const CropWindow window{101, 77, 64, 48, false};
  const DecodedWindow part = decoder.decode(jpeg, 3, 64, 48, [&](int64_t, int64_t) { return window; });
  EXPECT_EQ(part.scale, 1);
  EXPECT_LT(part.view.width, 320);  // columns cropped (to whole iMCUs)
  EXPECT_LE(part.view.height, 49);  // only the window's rows
  ResampleScratch scratch;
  std::vector<float> from_part(3 * 48 * 64), from_whole(3 * 48 * 64);
  render_window(part.view, part.window, kRaw3, 48, 64, from_part.data(), scratch);
  const ImageView whole = decoder.decode_full(jpeg, 3);
  render_window(whole, window, kRaw3, 48, 64, from_whole.data(), scratch);
  // libjpeg's upsampling of chroma at a cropped edge may differ by a level.
  EXPECT_LT(mean_difference(from_part, from_whole), 0.5);
}

// A window at least 8x the output is decoded at 1/8 in the DCT; the result
// stays close to resampling the full-size decode.
TEST(ImageDecode, LargeWindowsDecodeAtAReducedScale) {
  const std::vector<uint8_t> rgb = picture(512, 384, 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(interleaved(rgb.data(), 512, 384, 3), 90);
  ImageDecoder decoder;
  const CropWindow window{0, 0, 512, 384, false};
  for (auto [out_w, out_h, scale] :
       {std::tuple{64, 48, 8}, std::tuple{128, 96, 4}, std::tuple{256, 192, 2}, std::tuple{300, 200, 1}}) {
    const DecodedWindow d = decoder.decode(jpeg, 3, out_w, out_h, [&](int64_t, int64_t) { return window; });
    EXPECT_EQ(d.scale, scale) << out_w;
    EXPECT_EQ(d.full_width, 512);
    ResampleScratch scratch;
    std::vector<float> scaled(3 * out_w * out_h), full(3 * out_w * out_h);
    render_window(d.view, d.window, kRaw3, out_h, out_w, scaled.data(), scratch);
    const ImageView whole = decoder.decode_full(jpeg, 3);
    render_window(whole, window, kRaw3, out_h, out_w, full.data(), scratch);
    EXPECT_LT(mean_difference(scaled, full), 3.0) << out_w;
  }
}

// Pillow's JPEGs (libjpeg's encoder, as most files are written) in every
// colour form decode to the pixels Pillow decodes them to, bit for bit:
// RGB, progressive, grey, and Adobe CMYK (inverted ink).
TEST(ImageDecode, PillowsJpegsDecodeToPillowsPixels) {
  if (const std::string why = test_support::test_python_missing("PIL"); !why.empty()) GTEST_SKIP() << why;
  test_support::TempDir dir;
  const std::string script = dir.path("make.py");
  std::ofstream(script) << R"(import sys
from PIL import Image
im = Image.new("RGB", (61, 43))
im.putdata([((x * 4) % 256, (y * 6) % 256, (x * y) % 256) for y in range(43) for x in range(61)])
out = sys.argv[1]
for name, image, options in (("rgb", im, {}), ("progressive", im, {"progressive": True}),
                             ("grey", im.convert("L"), {}), ("cmyk", im.convert("CMYK"), {})):
    image.save(f"{out}/{name}.jpg", quality=92, **options)
    with open(f"{out}/{name}.rgb", "wb") as f:
        f.write(Image.open(f"{out}/{name}.jpg").convert("RGB").tobytes())
)";
  std::string out;
  ASSERT_EQ(test_support::run_command(test_support::test_python() + " " + script + " " + dir.path(), &out), 0)
      << out;
  ImageDecoder decoder;
  for (const char* name : {"rgb", "progressive", "grey", "cmyk"}) {
    const std::vector<uint8_t> jpeg = read_file(dir.path(std::string(name) + ".jpg"));
    const std::vector<uint8_t> expected = read_file(dir.path(std::string(name) + ".rgb"));
    EXPECT_EQ(pixels_of(decoder.decode_full(jpeg, 3)), expected) << name;
  }
}

TEST(ImageDecode, OtherBytesAreRefused) {
  ImageDecoder decoder;
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
  EXPECT_THROW(decoder.decode_full(text, 3), DataError);
  EXPECT_THROW(decoder.decode_full({}, 3), DataError);
}

// ---- the fuzz: truncated and bit-flipped files

// Every truncation of a JPEG or PNG into its pixel data, decoded whole, is
// a DataError naming the file (a cut that only drops the end marker, JPEG's
// EOI or PNG's IEND chunk, leaves every pixel intact); every bit flip
// either decodes or is a DataError naming it, never a crash. Through an
// image folder, as training reads them.
TEST(ImageDecode, TruncatedAndCorruptedFilesAreDataErrorsNamingTheFile) {
  test_support::TempDir dir;
  const std::vector<uint8_t> rgb = picture(96, 64, 3);
  const std::vector<std::vector<uint8_t>> sources = {
      encode_jpeg(interleaved(rgb.data(), 96, 64, 3), 85),
      encode_jpeg(interleaved(rgb.data(), 96, 64, 3), 85, true),
      encode_png(interleaved(rgb.data(), 96, 64, 3))};
  const size_t end_marker[] = {2, 2, 12};
  std::mt19937 rng(7);
  int errors = 0, decoded = 0;
  for (size_t s = 0; s < sources.size(); ++s) {
    const std::vector<uint8_t>& good = sources[s];
    std::vector<std::vector<uint8_t>> broken;
    for (size_t cut = 4; cut < good.size() - end_marker[s]; cut += std::max<size_t>(1, good.size() / 60)) {
      broken.emplace_back(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut));
    }
    const size_t truncated = broken.size();
    for (int k = 0; k < 150; ++k) {
      std::vector<uint8_t> flipped = good;
      for (int bits = 0; bits < 1 + k % 4; ++bits) {
        flipped[rng() % flipped.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      }
      broken.push_back(std::move(flipped));
    }
    const fs::path folder = dir.path("fuzz-" + std::to_string(s));
    for (size_t i = 0; i < broken.size(); ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "c/%05zu.img", i);
      write_file(folder / name, broken[i]);
    }
    ImageFolderOptions options{folder.string(), "", true};
    const Dataset data = [&] {
      Dataset d = open_image_folder(options, {1, 3, 32, 32});
      d.transform.crop = CropKind::kNone;  // the whole image: every row decoded
      return d;
    }();
    SampleScratch scratch;
    const PixelNorm norm = kRaw3;
    std::vector<float> image(3 * 32 * 32);
    int32_t label = 0;
    for (int64_t i = 0; i < data.count; ++i) {
      const std::string file = data.files->describe(i);
      const size_t index = static_cast<size_t>(std::stoul(fs::path(file).stem().string()));
      try {
        gather_sample(data, i, norm, {}, image.data(), &label, scratch);
        ++decoded;
        EXPECT_GE(index, truncated) << file << ": a truncated image decoded without an error";
      } catch (const DataError& e) {
        ++errors;
        EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
      }
    }
  }
  std::printf("fuzz: %d DataErrors, %d decoded (bit flips that left a valid image)\n", errors, decoded);
  EXPECT_GT(errors, 100);
}

// ---- transforms

TEST(Transform, ChoicesArePureFunctionsOfSeedEpochAndIndex) {
  TransformOptions t;
  t.crop = CropKind::kRandomResized;
  t.flip = true;
  std::set<std::tuple<double, double, double, double, bool>> seen;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t index = 0; index < 50; ++index) {
      const CropWindow a = plan_window(t, 400, 300, 224, 224, {9, epoch}, index);
      const CropWindow b = plan_window(t, 400, 300, 224, 224, {9, epoch}, index);
      EXPECT_EQ(std::tie(a.x, a.y, a.width, a.height, a.flip), std::tie(b.x, b.y, b.width, b.height, b.flip));
      seen.insert({a.x, a.y, a.width, a.height, a.flip});
      // Inside the image, with torchvision's area and aspect bounds (or its fallback).
      EXPECT_GE(a.x, 0);
      EXPECT_GE(a.y, 0);
      EXPECT_LE(a.x + a.width, 400);
      EXPECT_LE(a.y + a.height, 300);
      const double share = a.width * a.height / (400.0 * 300.0);
      EXPECT_GE(share, 0.08 * 0.95);
    }
  }
  EXPECT_GT(seen.size(), 140u) << "epochs and samples should draw different windows";
  const CropWindow other_seed = plan_window(t, 400, 300, 224, 224, {10, 0}, 0);
  const CropWindow first = plan_window(t, 400, 300, 224, 224, {9, 0}, 0);
  EXPECT_FALSE(other_seed.x == first.x && other_seed.y == first.y && other_seed.width == first.width);
}

// torchvision's fallback when ten tries fail: the largest centred window
// within the ratio range.
TEST(Transform, RandomResizedCropFallsBackToTheCentreLikeTorchvision) {
  TransformOptions t;
  t.crop = CropKind::kRandomResized;
  t.scale_min = t.scale_max = 1.0;  // the whole area...
  t.ratio_min = 2.0;                // ...at an aspect a square image cannot have
  t.ratio_max = 3.0;
  const CropWindow w = plan_window(t, 100, 100, 32, 32, {1, 0}, 5);
  EXPECT_EQ(w.width, 100);
  EXPECT_EQ(w.height, 50);  // round(100 / 2.0)
  EXPECT_EQ(w.x, 0);
  EXPECT_EQ(w.y, 25);
}

TEST(Transform, CentreCropAndNoneOnAnImageOfTheOutputsSizeCopyExactly) {
  const std::vector<uint8_t> p = picture(20, 16, 3);
  ResampleScratch scratch;
  for (CropKind crop : {CropKind::kNone, CropKind::kCenter}) {
    TransformOptions t;
    t.crop = crop;
    std::vector<float> out(3 * 16 * 20);
    render_window(interleaved(p.data(), 20, 16, 3), plan_window(t, 20, 16, 20, 16, {}, 0), kRaw3, 16, 20,
                  out.data(), scratch);
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t j = 0; j < 16 * 20; ++j) ASSERT_EQ(out[c * 320 + j], p[j * 3 + c]);
    }
  }
}

// CIFAR's recipe: a 32x32 window of the image padded by 4 zeros; the
// window's pixels are the image's, shifted, and zero outside.
TEST(Transform, RandomCropWithPaddingShiftsAndFillsZeros) {
  const std::vector<uint8_t> p = picture(32, 32, 1);
  TransformOptions t;
  t.crop = CropKind::kRandom;
  ResampleScratch scratch;
  std::set<std::pair<double, double>> offsets;
  for (int64_t index = 0; index < 1000; ++index) {
    const CropWindow w = plan_window(t, 32, 32, 32, 32, {3, 1}, index);
    offsets.insert({w.x, w.y});
    ASSERT_GE(w.x, -4);
    ASSERT_LE(w.x, 4);
    std::vector<float> out(32 * 32);
    render_window(interleaved(p.data(), 32, 32, 1), w, {{1}, {0}}, 32, 32, out.data(), scratch);
    for (int64_t y = 0; y < 32; ++y) {
      for (int64_t x = 0; x < 32; ++x) {
        const int64_t sx = x + static_cast<int64_t>(w.x), sy = y + static_cast<int64_t>(w.y);
        const bool inside = sx >= 0 && sx < 32 && sy >= 0 && sy < 32;
        ASSERT_EQ(out[y * 32 + x], inside ? p[sy * 32 + sx] : 0) << index << " " << x << "," << y;
      }
    }
  }
  EXPECT_EQ(offsets.size(), 81u);  // every shift of -4..4 in both directions
}

TEST(Transform, FlipMirrorsTheRow) {
  const std::vector<uint8_t> p = picture(8, 2, 1);
  ResampleScratch scratch;
  std::vector<float> out(16);
  render_window(interleaved(p.data(), 8, 2, 1), {0, 0, 8, 2, true}, {{1}, {0}}, 2, 8, out.data(), scratch);
  for (int64_t y = 0; y < 2; ++y) {
    for (int64_t x = 0; x < 8; ++x) ASSERT_EQ(out[y * 8 + x], p[y * 8 + 7 - x]);
  }
}

// In-memory data with a transform gathers each sample the same whichever
// batch, position or thread count it comes in.
TEST(Transform, GatheredSamplesDoNotDependOnTheirBatch) {
  Dataset data = make_synthetic({1, 3, 32, 32}, 4, 40, 2);
  data.transform.crop = CropKind::kRandom;
  data.transform.flip = true;
  const ChannelStats norm = channel_stats(data);
  const int64_t per = data.sample.per_sample();
  std::vector<int64_t> all(40);
  for (int64_t i = 0; i < 40; ++i) all[i] = 39 - i;
  std::vector<float> together(40 * per), alone(per);
  std::vector<int32_t> labels(40);
  int32_t label = 0;
  gather_batch(data, all, norm, {5, 2}, together.data(), labels.data());
  for (int64_t b : {0, 13, 39}) {
    gather_batch(data, {&all[b], 1}, norm, {5, 2}, alone.data(), &label);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), together.begin() + b * per)) << b;
  }
  DecodePool pool(3);
  std::vector<float> pooled(40 * per);
  pool.gather(data, all, pixel_norm(norm.mean, norm.stddev), {5, 2}, pooled.data(), labels.data());
  EXPECT_EQ(pooled, together);
  gather_batch(data, all, norm, {5, 3}, pooled.data(), labels.data());
  EXPECT_NE(pooled, together) << "another epoch should draw other crops";
}

// Without a transform the new path leaves in-memory gathering as it was.
TEST(Transform, NoTransformGathersAsBefore) {
  const Dataset data = make_synthetic({1, 3, 8, 8}, 3, 10, 4);
  const ChannelStats norm = channel_stats(data);
  std::vector<int64_t> idx = {3, 1, 4};
  std::vector<float> a(3 * 192), b(3 * 192);
  std::vector<int32_t> la(3), lb(3);
  gather_batch(data, idx, norm, a.data(), la.data());
  gather_batch(data, idx, norm, {7, 3}, b.data(), lb.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
}

// ---- image folders and lists

// A folder of `per_class` PNGs of 16x16 grey per class, from synthetic data.
Dataset write_folder(const fs::path& root, int classes, int per_class) {
  const Dataset source = make_synthetic({1, 1, 16, 16}, classes, classes * per_class, 11);
  for (int64_t i = 0; i < source.count; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "class-%d/img%03lld.png", source.labels[i], static_cast<long long>(i));
    write_file(root / name, encode_png(interleaved(source.pixels.data() + i * 256, 16, 16, 1)));
  }
  return source;
}

TEST(ImageFolder, ClassesAreSortedFoldersAndPixelsAreTheFiles) {
  test_support::TempDir dir;
  const Dataset source = write_folder(dir.path("train"), 3, 4);
  const Dataset data = open_image_folder({dir.path("train"), "", false}, {1, 1, 16, 16});
  ASSERT_EQ(data.count, 12);
  EXPECT_EQ(data.classes, 3);
  EXPECT_TRUE(data.pixels.empty());
  const ChannelStats unit{{0}, {1.0f / 255}};  // values as pixels
  std::vector<float> image(256);
  int32_t label = -1;
  for (int64_t i = 0; i < data.count; ++i) {
    gather_batch(data, {&i, 1}, unit, image.data(), &label);
    const std::string file = fs::path(data.files->describe(i)).stem().string();
    const int64_t s = std::stoll(file.substr(3));
    EXPECT_EQ(label, source.labels[s]);
    for (int64_t j = 0; j < 256; ++j) ASSERT_NEAR(image[j], source.pixels[s * 256 + j], 1e-3) << file;
    if (i > 0) EXPECT_GE(label, data.labels[i - 1]);  // class folders in order
  }
}

TEST(ImageFolder, OtherFilesAreAnErrorNamingThemOrSkippedWithACount) {
  test_support::TempDir dir;
  write_folder(dir.path("train"), 2, 2);
  write_file(dir.path("train/class-1/notes.txt"), {'h', 'i'});
  try {
    open_image_folder({dir.path("train"), "", false}, {1, 1, 16, 16});
    FAIL() << "a text file among the images was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("class-1/notes.txt: not a JPEG or PNG image"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("data.skip_unreadable"), std::string::npos) << e.what();
  }
  int64_t skipped = 0;
  const Dataset data = open_image_folder({dir.path("train"), "", true}, {1, 1, 16, 16}, &skipped);
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(data.count, 4);
}

TEST(ImageFolder, AListFileGivesPathsAndLabelsAndNamesABadLine) {
  test_support::TempDir dir;
  write_folder(dir.path("imgs"), 2, 2);
  std::ofstream(dir.path("list.txt"))
      << "# path label\nimgs/class-0/img000.png 7\nimgs/class-1/img001.png 2\n";
  const Dataset data = open_image_folder({"", dir.path("list.txt"), false}, {1, 1, 16, 16});
  EXPECT_EQ(data.count, 2);
  EXPECT_EQ(data.labels, (std::vector<int32_t>{7, 2}));
  EXPECT_EQ(data.classes, 8);
  std::ofstream(dir.path("bad.txt")) << "imgs/class-0/img000.png 1\nimgs/class-1/img001.png seven\n";
  try {
    open_image_folder({"", dir.path("bad.txt"), false}, {1, 1, 16, 16});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt:2: expected 'path label'"), std::string::npos) << e.what();
  }
}

// ---- shards

TEST(Shards, BracePatternsExpandWithTheirWidth) {
  EXPECT_EQ(expand_braces("a-{08..11}.tar"),
            (std::vector<std::string>{"a-08.tar", "a-09.tar", "a-10.tar", "a-11.tar"}));
  EXPECT_EQ(expand_braces("plain.tar"), (std::vector<std::string>{"plain.tar"}));
  EXPECT_EQ(expand_braces("x{1..2}y{0..1}").size(), 4u);
  EXPECT_THROW(expand_braces("a-{3..1}.tar"), DataError);
  EXPECT_THROW(expand_braces("a-{1..x}.tar"), DataError);
  EXPECT_THROW(expand_braces("a-{1..2.tar"), DataError);
}

// In-memory data packed into shards reads back sample for sample (PNG:
// lossless), with and without the index, and the index seeks to the same
// bytes the tar headers say.
TEST(Shards, PackedDataReadsBackIdenticallyWithAndWithoutIndex) {
  test_support::TempDir dir;
  const Dataset source = make_synthetic({1, 3, 12, 10}, 5, 23, 8);
  const PackResult packed = pack_shards(source, {.out_prefix = dir.path("s"), .samples_per_shard = 10});
  ASSERT_EQ(packed.shards.size(), 3u);
  EXPECT_EQ(packed.samples, 23);
  const std::string pattern = dir.path("s-{000000..000002}.tar");
  const Dataset indexed = open_shards({pattern}, {1, 3, 12, 10});
  for (const std::string& s : packed.shards) fs::remove(s + ".idx");
  const Dataset scanned = open_shards({pattern}, {1, 3, 12, 10});
  ASSERT_EQ(indexed.count, 23);
  EXPECT_EQ(indexed.labels, source.labels);
  EXPECT_EQ(scanned.labels, source.labels);
  const ChannelStats norm = channel_stats(source);
  std::vector<int64_t> all(23);
  for (int64_t i = 0; i < 23; ++i) all[i] = i;
  std::vector<float> a(23 * 360), b(23 * 360), c(23 * 360);
  std::vector<int32_t> la(23), lb(23), lc(23);
  gather_batch(source, all, norm, a.data(), la.data());
  gather_batch(indexed, all, norm, b.data(), lb.data());
  gather_batch(scanned, all, norm, c.data(), lc.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_EQ(indexed.files->describe(12), packed.shards[1] + ": member 000000012.png");
}

TEST(Shards, StaleIndexCorruptTarAndUnlabelledImagesAreNamed) {
  test_support::TempDir dir;
  const Dataset source = make_synthetic({1, 1, 8, 8}, 2, 4, 1);
  const PackResult packed = pack_shards(source, {.out_prefix = dir.path("t"), .samples_per_shard = 4});
  const std::string shard = packed.shards[0];
  auto error_of = [&](const std::string& pattern) -> std::string {
    try {
      open_shards({pattern}, {1, 1, 8, 8});
    } catch (const DataError& e) {
      return e.what();
    }
    return "";
  };
  {  // the shard grew after its index was written
    std::ofstream(shard, std::ios::app) << std::string(512, '\0');
    EXPECT_NE(error_of(shard).find(shard + ".idx:1: written for a shard of"), std::string::npos)
        << error_of(shard);
  }
  fs::remove(shard + ".idx");
  std::vector<uint8_t> bytes = read_file(shard);
  bytes[1024 + 10] ^= 0xFF;  // the second header's name (after the first member's 512): its checksum fails
  write_file(dir.path("bad.tar"), bytes);
  const std::string bad = error_of(dir.path("bad.tar"));
  EXPECT_NE(bad.find("bad.tar: corrupt tar header at byte"), std::string::npos) << bad;
  bytes = read_file(shard);
  bytes.resize(512 + 50);  // the first image cut short
  write_file(dir.path("short.tar"), bytes);
  EXPECT_NE(error_of(dir.path("short.tar")).find("short.tar: truncated tar: member 000000000.png"),
            std::string::npos)
      << error_of(dir.path("short.tar"));
  // An image member without its .cls.
  {
    TarWriter tar(dir.path("nolabel.tar"));
    const std::vector<uint8_t> png = encode_png(interleaved(source.pixels.data(), 8, 8, 1));
    tar.add("k1.png", png);
    tar.finish();
  }
  EXPECT_NE(error_of(dir.path("nolabel.tar")).find("member k1.png has no label (expected k1.cls)"),
            std::string::npos)
      << error_of(dir.path("nolabel.tar"));
}

// A corrupt image inside a shard names the shard and the member.
TEST(Shards, ACorruptMemberIsADataErrorNamingShardAndMember) {
  test_support::TempDir dir;
  std::vector<uint8_t> rgb = picture(32, 32, 3);
  std::vector<uint8_t> jpeg = encode_jpeg(interleaved(rgb.data(), 32, 32, 3), 90);
  jpeg.resize(jpeg.size() / 2);
  {
    TarWriter tar(dir.path("c.tar"));
    tar.add("a/x.jpg", jpeg);
    tar.add("a/x.cls", std::vector<uint8_t>{'3'});
    tar.finish();
  }
  Dataset data = open_shards({dir.path("c.tar")}, {1, 3, 16, 16});
  EXPECT_EQ(data.labels, (std::vector<int32_t>{3}));
  std::vector<float> image(3 * 256);
  int32_t label = 0;
  const int64_t zero = 0;
  try {
    gather_batch(data, {&zero, 1}, {{0, 0, 0}, {1, 1, 1}}, image.data(), &label);
    FAIL() << "half a JPEG decoded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path("c.tar") + ": member a/x.jpg: corrupt JPEG"),
              std::string::npos)
        << e.what();
  }
}

// --max-side stores JPEGs smaller; the labels stay.
TEST(Shards, PackingWithMaxSideShrinksLargeJpegs) {
  test_support::TempDir dir;
  const std::vector<uint8_t> big = picture(300, 200, 3), small = picture(60, 40, 3);
  write_file(dir.path("f/a/big.jpg"), encode_jpeg(interleaved(big.data(), 300, 200, 3), 90));
  write_file(dir.path("f/b/small.jpg"), encode_jpeg(interleaved(small.data(), 60, 40, 3), 90));
  const Dataset folder = open_image_folder({dir.path("f"), "", false}, {1, 3, 32, 32});
  const PackResult r = pack_shards(folder, {.out_prefix = dir.path("p"), .max_side = 100});
  EXPECT_EQ(r.resized, 1);
  const Dataset shards = open_shards({r.shards[0]}, {1, 3, 32, 32});
  EXPECT_EQ(shards.labels, folder.labels);
  ImageDecoder decoder;
  std::vector<uint8_t> bytes;
  shards.files->read(0, bytes);
  const ImageView v = decoder.decode_full(bytes, 3);
  EXPECT_EQ(v.width, 100);
  EXPECT_EQ(v.height, 67);
}

// ---- the pool

TEST(DecodePool, GathersFilesAsOneThreadDoesAndMeasuresItsRate) {
  test_support::TempDir dir;
  write_folder(dir.path("train"), 3, 10);
  Dataset data = open_image_folder({dir.path("train"), "", false}, {1, 1, 12, 12});
  data.transform.crop = CropKind::kRandomResized;
  data.transform.flip = true;
  const ChannelStats norm = channel_stats(data);
  std::vector<int64_t> idx = epoch_permutation(3, 0, data.count);
  std::vector<float> alone(30 * 144), pooled(30 * 144);
  std::vector<int32_t> la(30), lb(30);
  gather_batch(data, idx, norm, {4, 1}, alone.data(), la.data());
  DecodePool pool(4);
  EXPECT_EQ(pool.measured_rate().images, 0);
  pool.gather(data, idx, pixel_norm(norm.mean, norm.stddev), {4, 1}, pooled.data(), lb.data());
  EXPECT_EQ(alone, pooled);
  EXPECT_EQ(la, lb);
  const InputRate rate = pool.measured_rate();
  EXPECT_EQ(rate.images, 30);
  EXPECT_EQ(rate.workers, 4);
  EXPECT_GT(rate.images_per_second, 0);
  // A broken file fails the gather with its name; the pool stays usable.
  write_file(data.files->describe(5), {0xFF, 0xD8, 0xFF, 0x00});
  try {
    pool.gather(data, idx, pixel_norm(norm.mean, norm.stddev), {4, 1}, pooled.data(), lb.data());
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(data.files->describe(5)), std::string::npos) << e.what();
  }
  std::vector<int64_t> good = {0, 1, 2};
  EXPECT_NO_THROW(
      pool.gather(data, good, pixel_norm(norm.mean, norm.stddev), {4, 1}, pooled.data(), lb.data()));
}

// The pool reads a batch's images in storage order (each shard front to
// back, shard after shard), not in the batch's order: with one worker and
// two broken members, the failure names the one that lies first.
TEST(DecodePool, ReadsABatchInStorageOrder) {
  test_support::TempDir dir;
  const Dataset source = make_synthetic({1, 1, 16, 16}, 2, 20, 5);
  const PackResult packed = pack_shards(source, {.out_prefix = dir.path("s"), .samples_per_shard = 10});
  ASSERT_EQ(packed.shards.size(), 2u);
  const Dataset data = open_shards({dir.path("s-{000000..000001}.tar")}, {1, 1, 16, 16});
  EXPECT_LT(data.files->location(3), data.files->location(4));
  EXPECT_LT(data.files->location(9), data.files->location(10));
  for (int64_t broken : {3, 15}) {
    const ImageFiles::Location at = data.files->location(broken);
    std::fstream shard(packed.shards[static_cast<size_t>(at.shard)], std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(at.offset);
    shard.write("\0\0\0\0\0\0\0\0", 8);
  }
  DecodePool pool(1);
  const std::vector<int64_t> batch = {15, 7, 3};
  std::vector<float> images(3 * 256);
  std::vector<int32_t> labels(3);
  try {
    pool.gather(data, batch, pixel_norm({0}, {1}), {}, images.data(), labels.data());
    FAIL() << "broken members decoded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(data.files->describe(3)), std::string::npos) << e.what();
  }
}

TEST(DecodePool, DefaultWorkersLeaveTheComputeItsCores) {
  EXPECT_EQ(default_decode_workers(true, 2, 2, 1), 1);  // this CI box: compute takes both
  EXPECT_EQ(default_decode_workers(true, 32, 8, 1), 24);
  EXPECT_EQ(default_decode_workers(false, 64, 1, 8), 7);  // 8 GPUs on 64 cores: 8 each, one runs the loop
  EXPECT_EQ(default_decode_workers(false, 4, 1, 8), 1);
}

}  // namespace
}  // namespace vtrain::worker
