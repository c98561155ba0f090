// Datasets: IDX (MNIST / Fashion-MNIST, gzip or plain), CIFAR-10 binary,
// synthetic data of any shape, and image files (image folders and tar
// shards, worker/data/image_files.h); seeded per-epoch shuffling; batch
// gathering.
//
// In-memory images are kept as 8-bit pixels (value / 255 is the intensity);
// image files stay on disk. Either is turned into standardised floats, through
// the dataset's transform, only when a batch is gathered.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/name_table.h"
#include "worker/data/transform.h"
#include "worker/device/tensor.h"

namespace vtrain::worker {

// A data file is missing, truncated or not what it claims to be. The message
// names the file and what was expected.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where a job's data comes from (data.kind in the config).
enum class DataKind {
  kIdx,        // MNIST / Fashion-MNIST IDX files (load_idx)
  kCifar10,    // CIFAR-10 binary batches (load_cifar10)
  kSynthetic,    // generated (make_synthetic)
  kImageFolder,  // JPEG / PNG files in <class> folders or a list (open_image_folder)
  kShards,       // WebDataset tar shards (open_shards)
};
inline constexpr auto kDataKindNames = std::to_array<common::Named<DataKind>>(
    {{DataKind::kIdx, "idx"},
     {DataKind::kCifar10, "cifar10"},
     {DataKind::kSynthetic, "synthetic"},
     {DataKind::kImageFolder, "imagefolder"},
     {DataKind::kShards, "shards"}});
inline const char* data_kind_name(DataKind kind) { return common::name_of(kDataKindNames, kind); }

// Where samples [first, first + count) of a dataset came from: records
// 0..count-1 of the file `path`. Lets a check after loading name the file.
struct LabelSource {
  std::string path;
  int64_t first = 0;
  int64_t count = 0;
};

class ImageFiles;  // worker/data/image_files.h

struct Dataset {
  Shape sample{1, 1, 1, 1};     // per-sample shape (n = 1): the network's input
  int64_t classes = 0;          // labels are in [0, classes)
  int64_t count = 0;            // samples
  std::vector<uint8_t> pixels;  // count * sample.per_sample(), NCHW
  std::vector<int32_t> labels;  // count
  std::vector<LabelSource> sources;  // the label files in sample order; empty for synthetic data
  // Image files: where sample i's encoded image lies (pixels stays empty).
  std::shared_ptr<const ImageFiles> files;
  // What a sample goes through on its way into a batch; crop none without
  // flip on an in-memory image of the sample's size leaves it as stored.
  TransformOptions transform;
};

// IDX image file (magic 0x00000803, n x rows x cols) and label file (magic
// 0x00000801) as in MNIST; each may be gzip-compressed (detected by content,
// not by name). Counts must agree; classes = max label + 1 (at least 10 is not
// assumed). Throws DataError.
Dataset load_idx(const std::string& images_path, const std::string& labels_path);

// CIFAR-10 binary batches: records of 1 label byte + 3072 pixel bytes
// (3 x 32 x 32). Throws DataError for a size not a multiple of 3073, an empty
// file or a label > 9.
Dataset load_cifar10(const std::vector<std::string>& batch_paths);

// Learnable synthetic data: each class has a fixed random prototype image and
// samples are the prototype plus noise; the same seed gives the same data on
// every platform, and sample i does not depend on `count`. Labels are
// i % classes. Throws std::invalid_argument for a bad shape, classes or count.
Dataset make_synthetic(const Shape& sample, int64_t classes, int64_t count, uint64_t seed);

// Throws DataError unless every label is in [0, classes), where `classes` is
// the model's output count. The message names the first bad label's file and
// its index there (or its sample index when the dataset has no sources), the
// label and the valid range.
void check_labels(const Dataset& data, int64_t classes);

// Per-channel mean and (population) standard deviation of value / 255 over
// the dataset; for image files over up to kStatsSamples samples spread
// evenly through it, as its transform renders them in epoch 0 of seed 0.
// Throws std::invalid_argument for an empty dataset.
inline constexpr int64_t kStatsSamples = 1000;
struct ChannelStats {
  std::vector<float> mean;
  std::vector<float> stddev;
};
ChannelStats channel_stats(const Dataset& data);

// Writes the samples `indices` as floats (pixel / 255 - mean[c]) / stddev[c],
// NCHW, into `images` (indices.size() * per_sample) and their labels. A
// channel with stddev 0 is only centred. Throws std::invalid_argument when
// `norm` does not have one entry per channel, std::out_of_range for an index
// outside [0, count).
void gather_batch(const Dataset& data, std::span<const int64_t> indices,
                  const ChannelStats& norm, float* images, int32_t* labels);

// The same through data.transform, each sample's random choices drawn from
// (draw.seed, draw.epoch, its index in the dataset). Image files are read
// and decoded here; a file that cannot be is a DataError naming it. Uses a
// decoder and buffers of the calling thread (worker/data/gather.h).
void gather_batch(const Dataset& data, std::span<const int64_t> indices,
                  const ChannelStats& norm, SampleDraw draw, float* images, int32_t* labels);

// The permutation of [0, count) used in `epoch`: a pure function of
// (seed, epoch, count), so every rank draws the same one.
std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t count);

}  // namespace vtrain::worker
