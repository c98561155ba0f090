#include "worker/data/data.h"

#include "worker/data/gather.h"
#include "worker/data/random.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>

namespace vtrain::worker {
namespace {

using data_random::Rng;

// ---------------------------------------------------------------------------
// Files.

std::string hex32(uint32_t value) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", value);
  return buf;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// Opens `path` for reading or throws DataError naming it and the OS reason.
FilePtr open_or_throw(const std::string& path) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) throw DataError(path + ": cannot open: " + std::strerror(errno));
  return f;
}

// A data file, gzip-compressed or not (told by its first two bytes, not its
// name). gzip data is inflated here rather than read through gzread, which
// stops without a word at bytes after the gzip data that do not start
// another gzip member (a damaged download, a file appended to another):
// here they are an error. Members one after another (gzip -c a b) are one
// stream, as gunzip reads them.
class DataFile {
 public:
  explicit DataFile(const std::string& path)
      : path_(path), file_(open_or_throw(path)), buffer_(kBufferBytes) {
    fill(2);
    gzip_ = stream_.avail_in >= 2 && buffer_[0] == 0x1f && buffer_[1] == 0x8b;
    // 16 + MAX_WBITS: deflate data inside a gzip header and trailer.
    if (gzip_ && inflateInit2(&stream_, 16 + MAX_WBITS) != Z_OK) fail("zlib out of memory");
  }
  ~DataFile() {
    if (gzip_) inflateEnd(&stream_);
  }
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& what) const { throw DataError(path_ + ": " + what); }

  // Reads up to `size` bytes into `dst`; fewer only where the data ends.
  size_t read(uint8_t* dst, size_t size) { return gzip_ ? inflate_into(dst, size) : copy_into(dst, size); }

  // Appends up to `size` bytes to `out`, growing it as data arrives, so that a
  // corrupt header claiming gigabytes costs no more memory than the file has.
  size_t read_into(std::vector<uint8_t>& out, uint64_t size) {
    constexpr uint64_t kFirstChunk = 64ULL << 20;
    const size_t start = out.size();
    uint64_t done = 0;
    while (done < size) {
      const uint64_t chunk = std::min(size - done, std::max<uint64_t>(done, kFirstChunk));
      out.resize(start + done + chunk);
      const size_t n = read(out.data() + start + done, chunk);
      done += n;
      if (n < chunk) {
        out.resize(start + done);
        break;
      }
    }
    return done;
  }

  // Bytes left before the end of the data (consumed).
  uint64_t drain() {
    std::vector<uint8_t> sink(1 << 16);
    uint64_t total = 0;
    for (;;) {
      const size_t n = read(sink.data(), sink.size());
      total += n;
      if (n < sink.size()) return total;
    }
  }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 18;  // fewer reads for the tens of MB of MNIST

  // Reads from the file until the buffer holds at least `want` unconsumed
  // bytes or the file ends.
  void fill(size_t want) {
    if (stream_.avail_in >= want || at_end_) return;
    if (stream_.avail_in > 0) {
      std::memmove(buffer_.data(), stream_.next_in, stream_.avail_in);  // keep the unconsumed rest
    }
    size_t have = stream_.avail_in;
    while (have < want && !at_end_) {
      const size_t got = std::fread(buffer_.data() + have, 1, buffer_.size() - have, file_.get());
      // fopen succeeds on a directory; the read is where Linux reports it.
      if (got == 0 && std::ferror(file_.get())) fail(std::string("cannot read: ") + std::strerror(errno));
      at_end_ = got == 0;
      have += got;
      file_bytes_ += got;
    }
    stream_.next_in = buffer_.data();
    stream_.avail_in = static_cast<uInt>(have);
  }

  void consume(size_t bytes) {
    stream_.next_in += bytes;
    stream_.avail_in -= static_cast<uInt>(bytes);
  }

  size_t copy_into(uint8_t* dst, size_t size) {
    size_t total = 0;
    while (total < size) {
      fill(1);
      if (stream_.avail_in == 0) break;
      const size_t n = std::min<size_t>(size - total, stream_.avail_in);
      std::memcpy(dst + total, stream_.next_in, n);
      consume(n);
      total += n;
    }
    return total;
  }

  size_t inflate_into(uint8_t* dst, size_t size) {
    size_t total = 0;
    while (total < size) {
      if (member_ended_ && !next_member()) break;
      fill(1);
      const uInt room = static_cast<uInt>(std::min<size_t>(size - total, INT_MAX / 2));
      stream_.next_out = dst + total;
      stream_.avail_out = room;
      const int rc = inflate(&stream_, Z_NO_FLUSH);
      total += room - stream_.avail_out;
      if (rc == Z_STREAM_END) {
        member_ended_ = true;
      } else if (rc == Z_BUF_ERROR && stream_.avail_in == 0 && at_end_) {
        fail("corrupt gzip data: the compressed stream ends early");
      } else if (rc == Z_MEM_ERROR) {
        fail("zlib out of memory");
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        fail(std::string("corrupt gzip data (zlib: ") + (stream_.msg ? stream_.msg : zError(rc)) + ")");
      }
    }
    return total;
  }

  // After a gzip member: false at the end of the file, true when another
  // member follows; anything else fails, naming where the gzip data ended.
  bool next_member() {
    fill(2);
    if (stream_.avail_in == 0) return false;
    if (stream_.avail_in >= 2 && stream_.next_in[0] == 0x1f && stream_.next_in[1] == 0x8b) {
      inflateReset(&stream_);
      member_ended_ = false;
      return true;
    }
    const uint64_t end = file_bytes_ - stream_.avail_in;
    uint64_t extra = 0;
    for (; stream_.avail_in > 0; fill(1)) {
      extra += stream_.avail_in;
      consume(stream_.avail_in);
    }
    fail("corrupt gzip data: " + std::to_string(extra) + " bytes follow the end of the gzip data at byte " +
         std::to_string(end) + " and do not start another gzip member");
  }

  std::string path_;
  FilePtr file_;
  std::vector<uint8_t> buffer_;
  z_stream stream_{};      // next_in / avail_in: the buffer's unconsumed bytes, gzip or not
  uint64_t file_bytes_ = 0;  // read from the file so far
  bool at_end_ = false;      // the file has no more bytes
  bool gzip_ = false;
  bool member_ended_ = false;
};

// ---------------------------------------------------------------------------
// IDX.

constexpr uint32_t kIdxImageMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kIdxLabelMagic = 0x00000801;  // unsigned bytes, 1 dimension

// Reads the magic and `dims.size()` big-endian dimensions of an IDX file.
void read_idx_header(DataFile& in, uint32_t magic, const char* kind, std::span<uint32_t> dims) {
  std::array<uint8_t, 16> raw{};
  const size_t header_bytes = 4 * (1 + dims.size());
  const size_t got = in.read(raw.data(), header_bytes);
  if (got == 0) in.fail(std::string("file is empty, expected an IDX ") + kind + " file");
  if (got < 4) in.fail("too short for an IDX header (" + std::to_string(got) + " bytes)");

  auto word = [&](size_t i) {
    return uint32_t{raw[4 * i]} << 24 | uint32_t{raw[4 * i + 1]} << 16 |
           uint32_t{raw[4 * i + 2]} << 8 | uint32_t{raw[4 * i + 3]};
  };
  const uint32_t found = word(0);
  if (found != magic) {
    std::string what =
        std::string("expected IDX ") + kind + " magic " + hex32(magic) + ", found " + hex32(found);
    if (found == kIdxImageMagic) what += " (an IDX image file)";
    if (found == kIdxLabelMagic) what += " (an IDX label file)";
    in.fail(what);
  }
  if (got < header_bytes) {
    in.fail(std::string("truncated IDX ") + kind + " header: expected " +
            std::to_string(header_bytes) + " bytes, found " + std::to_string(got));
  }
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = word(i + 1);
}

// Fails if anything follows the `declared` bytes (what the header described).
void expect_end(DataFile& in, const std::string& declared) {
  const uint64_t extra = in.drain();
  if (extra != 0) {
    in.fail(std::to_string(extra) + " unexpected bytes after the " + declared +
            " the header declares");
  }
}

void read_idx_images(const std::string& path, Dataset& data) {
  DataFile in(path);
  std::array<uint32_t, 3> dims{};
  read_idx_header(in, kIdxImageMagic, "image", dims);
  const auto [count, rows, cols] = dims;
  if (count == 0) in.fail("contains no images (the header count is 0)");
  if (rows == 0 || cols == 0) {
    in.fail("header says images of " + std::to_string(rows) + "x" + std::to_string(cols) +
            " pixels");
  }
  // Each factor is below 2^32, so the pixel count may overflow 64 bits only
  // through the image count; such a header is rejected as truncated below.
  const uint64_t per_image = uint64_t{rows} * cols;
  const bool overflows = per_image > UINT64_MAX / count;
  const uint64_t bytes = overflows ? UINT64_MAX : per_image * count;
  const std::string declared =
      std::to_string(count) + " images of " + std::to_string(rows) + "x" + std::to_string(cols);

  const uint64_t got = in.read_into(data.pixels, bytes);
  if (got < bytes) {
    in.fail("truncated: header says " + declared + " (" +
            (overflows ? std::string("more than 2^64") : std::to_string(bytes)) +
            " bytes) but only " + std::to_string(got) + " bytes follow");
  }
  expect_end(in, declared);

  data.sample = {1, 1, rows, cols};
  data.count = count;
}

void read_idx_labels(const std::string& path, Dataset& data) {
  DataFile in(path);
  std::array<uint32_t, 1> dims{};
  read_idx_header(in, kIdxLabelMagic, "label", dims);
  const uint32_t count = dims[0];
  const std::string declared = std::to_string(count) + " labels";

  std::vector<uint8_t> raw;
  const uint64_t got = in.read_into(raw, count);
  if (got < count) {
    in.fail("truncated: header says " + declared + " (" + std::to_string(count) +
            " bytes) but only " + std::to_string(got) + " bytes follow");
  }
  expect_end(in, declared);

  data.labels.assign(raw.begin(), raw.end());
  data.sources = {{path, 0, static_cast<int64_t>(count)}};
}

// ---------------------------------------------------------------------------
// CIFAR-10.

constexpr int64_t kCifarPixels = 3 * 32 * 32;
constexpr int64_t kCifarRecord = 1 + kCifarPixels;
constexpr int64_t kCifarClasses = 10;

void append_cifar10(const std::string& path, Dataset& data) {
  FilePtr f = open_or_throw(path);
  auto fail = [&](const std::string& what) { throw DataError(path + ": " + what); };

  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read size: " + ec.message());
  if (size == 0) fail("file is empty, expected CIFAR-10 records of 3073 bytes");
  if (size % kCifarRecord != 0) {
    const uintmax_t whole = size / kCifarRecord;
    std::string what =
        "size " + std::to_string(size) + " bytes is not a multiple of the " +
        std::to_string(kCifarRecord) + "-byte CIFAR-10 record (1 label + 3x32x32 pixels); " +
        std::to_string(whole) + " whole records would be " + std::to_string(whole * kCifarRecord) +
        " bytes, a standard batch of 10000 is " + std::to_string(10000 * kCifarRecord);
    // The CIFAR-100 binary format has a coarse and a fine label byte.
    if (size % (kCifarRecord + 1) == 0) what += " (this looks like CIFAR-100, 3074-byte records)";
    fail(what);
  }

  const int64_t records = static_cast<int64_t>(size / kCifarRecord);
  const int64_t first = data.count;
  data.pixels.resize(static_cast<size_t>((first + records) * kCifarPixels));
  data.labels.resize(static_cast<size_t>(first + records));
  std::vector<uint8_t> record(kCifarRecord);
  for (int64_t r = 0; r < records; ++r) {
    if (std::fread(record.data(), 1, record.size(), f.get()) != record.size()) {
      fail("read failed at record " + std::to_string(r) +
           (std::ferror(f.get()) ? std::string(": ") + std::strerror(errno)
                                 : std::string(": the file shrank while being read")));
    }
    if (record[0] >= kCifarClasses) {
      fail("record " + std::to_string(r) + " has label " + std::to_string(record[0]) +
           ", CIFAR-10 labels are 0..9");
    }
    data.labels[first + r] = record[0];
    std::copy(record.begin() + 1, record.end(), data.pixels.begin() + (first + r) * kCifarPixels);
  }
  data.count = first + records;
  data.sources.push_back({path, first, records});
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path) {
  Dataset data;
  read_idx_images(images_path, data);
  read_idx_labels(labels_path, data);
  if (static_cast<int64_t>(data.labels.size()) != data.count) {
    throw DataError("count mismatch: " + images_path + " has " + std::to_string(data.count) +
                    " images but " + labels_path + " has " + std::to_string(data.labels.size()) +
                    " labels");
  }
  data.classes = *std::max_element(data.labels.begin(), data.labels.end()) + 1;
  return data;
}

Dataset load_cifar10(const std::vector<std::string>& batch_paths) {
  if (batch_paths.empty()) throw DataError("load_cifar10: no batch files given");
  Dataset data;
  data.sample = {1, 3, 32, 32};
  data.classes = kCifarClasses;
  for (const std::string& path : batch_paths) append_cifar10(path, data);
  return data;
}

Dataset make_synthetic(const Shape& sample, int64_t classes, int64_t count, uint64_t seed) {
  if (sample.c < 1 || sample.h < 1 || sample.w < 1) {
    throw std::invalid_argument("make_synthetic: bad sample shape " + sample.str());
  }
  if (classes < 1 || classes > INT32_MAX) {
    throw std::invalid_argument("make_synthetic: classes must be in [1, 2^31), got " +
                                std::to_string(classes));
  }
  if (count < 0) {
    throw std::invalid_argument("make_synthetic: negative count " + std::to_string(count));
  }
  // Noise of +-kNoise around prototypes drawn uniformly from [0, 255]: two
  // prototypes differ by about 100 per pixel on average, so classes stay
  // separable, while samples of one class still differ enough that a model
  // has to generalise rather than memorise.
  constexpr int kNoise = 64;
  // Separates these streams from epoch_permutation's for the same seed.
  constexpr uint64_t kSyntheticKey = 0x5E7F1C0DA7A5E7ULL;

  Dataset data;
  data.sample = {1, sample.c, sample.h, sample.w};
  data.classes = classes;
  data.count = count;
  const int64_t per_sample = data.sample.per_sample();

  // Eight bytes per draw: pixels are cheap to generate this way.
  auto fill_bytes = [](Rng& rng, uint8_t* dst, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
      uint64_t bits = rng.next();
      for (int64_t k = i; k < std::min(n, i + 8); ++k, bits >>= 8) dst[k] = uint8_t(bits);
    }
  };

  std::vector<uint8_t> prototypes(static_cast<size_t>(classes * per_sample));
  Rng proto_rng(seed ^ kSyntheticKey, 0);
  fill_bytes(proto_rng, prototypes.data(), classes * per_sample);

  data.pixels.resize(static_cast<size_t>(count * per_sample));
  data.labels.resize(static_cast<size_t>(count));
  std::vector<uint8_t> noise(static_cast<size_t>(per_sample));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t label = i % classes;  // balanced; the epoch permutation shuffles
    data.labels[i] = static_cast<int32_t>(label);
    // One stream per sample: sample i is the same whatever `count` is.
    Rng rng(seed ^ kSyntheticKey, static_cast<uint64_t>(i) + 1);
    fill_bytes(rng, noise.data(), per_sample);
    const uint8_t* proto = prototypes.data() + label * per_sample;
    uint8_t* dst = data.pixels.data() + i * per_sample;
    for (int64_t j = 0; j < per_sample; ++j) {
      // Maps a byte onto [-kNoise, kNoise] by multiply-shift (nearly uniform).
      const int offset = ((int{noise[j]} * (2 * kNoise + 1)) >> 8) - kNoise;
      dst[j] = static_cast<uint8_t>(std::clamp(int{proto[j]} + offset, 0, 255));
    }
  }
  return data;
}

void check_labels(const Dataset& data, int64_t classes) {
  const auto bad = std::find_if(data.labels.begin(), data.labels.end(),
                                [&](int32_t label) { return label < 0 || label >= classes; });
  if (bad == data.labels.end()) return;
  const int64_t index = bad - data.labels.begin();
  const std::string what = "label " + std::to_string(*bad) + " is outside [0, " +
                           std::to_string(classes) + "), the model's " + std::to_string(classes) +
                           " classes";
  for (const LabelSource& source : data.sources) {
    if (index >= source.first && index < source.first + source.count) {
      throw DataError(source.path + ": label index " + std::to_string(index - source.first) + ": " +
                      what);
    }
  }
  throw DataError("sample " + std::to_string(index) + ": " + what);
}

ChannelStats channel_stats(const Dataset& data) {
  const int64_t channels = data.sample.c;
  const int64_t plane = data.sample.h * data.sample.w;
  if (data.count == 0) throw std::invalid_argument("channel_stats: the dataset is empty");
  if (data.files) return file_channel_stats(data);

  // A histogram per channel: counting is exact and fast, and the two-pass mean
  // and variance over 256 bins then cost nothing and lose no precision.
  std::vector<std::array<uint64_t, 256>> hist(static_cast<size_t>(channels));
  for (auto& h : hist) h.fill(0);
  for (int64_t i = 0; i < data.count; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      const uint8_t* src = data.pixels.data() + (i * channels + c) * plane;
      auto& h = hist[c];
      for (int64_t j = 0; j < plane; ++j) ++h[src[j]];
    }
  }

  ChannelStats stats;
  const double n = static_cast<double>(data.count) * static_cast<double>(plane);
  for (const auto& h : hist) {
    double sum = 0;
    for (int v = 0; v < 256; ++v) sum += static_cast<double>(h[v]) * (v / 255.0);
    const double mean = sum / n;
    double squares = 0;
    for (int v = 0; v < 256; ++v) {
      const double d = v / 255.0 - mean;
      squares += static_cast<double>(h[v]) * d * d;
    }
    stats.mean.push_back(static_cast<float>(mean));
    stats.stddev.push_back(static_cast<float>(std::sqrt(squares / n)));
  }
  return stats;
}

void gather_batch(const Dataset& data, std::span<const int64_t> indices, const ChannelStats& norm,
                  float* images, int32_t* labels) {
  if (transforms_samples(data)) {
    gather_batch(data, indices, norm, SampleDraw{}, images, labels);
    return;
  }
  const int64_t channels = data.sample.c;
  const int64_t plane = data.sample.h * data.sample.w;
  const int64_t per_sample = channels * plane;
  if (static_cast<int64_t>(norm.mean.size()) != channels ||
      static_cast<int64_t>(norm.stddev.size()) != channels) {
    throw std::invalid_argument("gather_batch: normalisation has " +
                                std::to_string(norm.mean.size()) + " means and " +
                                std::to_string(norm.stddev.size()) + " deviations for " +
                                std::to_string(channels) + " channels");
  }

  // (p / 255 - mean) / stddev as one multiply-add per pixel. A constant
  // channel (stddev 0) is only centred, so it becomes 0 instead of NaN.
  std::vector<float> scale(static_cast<size_t>(channels));
  std::vector<float> offset(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const double sd = norm.stddev[c] > 0 ? double{norm.stddev[c]} : 1.0;
    scale[c] = static_cast<float>(1.0 / (255.0 * sd));
    offset[c] = static_cast<float>(-double{norm.mean[c]} / sd);
  }

  for (size_t b = 0; b < indices.size(); ++b) {
    const int64_t index = indices[b];
    if (index < 0 || index >= data.count) {
      throw std::out_of_range("gather_batch: sample index " + std::to_string(index) +
                              " outside [0, " + std::to_string(data.count) + ")");
    }
    labels[b] = data.labels[index];
    const uint8_t* src = data.pixels.data() + index * per_sample;
    float* dst = images + static_cast<int64_t>(b) * per_sample;
    for (int64_t c = 0; c < channels; ++c) {
      const float s = scale[c];
      const float o = offset[c];
      for (int64_t j = 0; j < plane; ++j) dst[j] = static_cast<float>(src[j]) * s + o;
      src += plane;
      dst += plane;
    }
  }
}

std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t count) {
  if (count < 0) {
    throw std::invalid_argument("epoch_permutation: negative count " + std::to_string(count));
  }
  std::vector<int64_t> perm(static_cast<size_t>(count));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  Rng rng(seed, static_cast<uint64_t>(epoch));
  for (int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

}  // namespace vtrain::worker
