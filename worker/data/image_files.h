// Datasets that stay on disk: an image folder (<class>/<file>, or a list of
// "path label" lines) and WebDataset tar shards (<key>.jpg|.jpeg|.png +
// <key>.cls). Only the sample list (where each image lies, its label) is
// held in memory; each image is read and decoded when a batch needs it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "worker/data/data.h"

namespace vtrain::worker {

// Where the encoded images lie. read() is thread-safe.
class ImageFiles {
 public:
  ImageFiles() = default;
  ~ImageFiles();
  ImageFiles(const ImageFiles&) = delete;
  ImageFiles& operator=(const ImageFiles&) = delete;

  int64_t count() const { return static_cast<int64_t>(entries_.size()); }
  // Sample i's encoded bytes into `bytes` (resized; its memory is reused).
  // Throws DataError naming the file (and shard member).
  void read(int64_t i, std::vector<uint8_t>& bytes) const;
  // "path" for a file, "shard.tar: member key.jpg" for a shard member.
  std::string describe(int64_t i) const;
  // Where sample i's bytes lie, ordered as reading the storage front to
  // back meets them: a shard member's shard and byte offset; a file's
  // shard -1 and its number (the folder's sorted walk).
  struct Location {
    int32_t shard = -1;
    int64_t offset = 0;
    friend auto operator<=>(const Location&, const Location&) = default;
  };
  Location location(int64_t i) const;

  // An image in its own file.
  void add_file(std::string path);
  // A shard, opened for the whole run; returns its number.
  int32_t add_shard(const std::string& path);
  // Bytes [offset, offset + size) of shard `shard`, named `member`.
  void add_member(int32_t shard, int64_t offset, int64_t size, std::string member);

 private:
  struct Entry {
    int32_t shard = -1;  // -1: the whole file paths_[name]
    int32_t name = 0;    // index into paths_ (a file) or members_ (a shard member)
    int64_t offset = 0, size = 0;
  };
  std::vector<std::string> paths_;    // image files
  std::vector<std::string> members_;  // shard members' names
  std::vector<std::string> shards_;
  std::vector<int> shard_fds_;
  std::vector<Entry> entries_;
};

struct ImageFolderOptions {
  std::string dir;         // <dir>/<class>/<file>, classes the sorted folder names
  std::string list;        // instead of the folders: lines "path label" (paths relative to dir,
                           // or to the list's folder when dir is empty)
  bool skip_unreadable = false;  // skip (and count) files that are not JPEG or PNG instead of failing
};

// The samples of an image folder or list: sample list and labels, no
// pixels (Dataset::files is set, Dataset::sample is `shape`). Folders are
// walked in sorted order (files too, recursively), as torchvision's
// ImageFolder does, so sample i is the same file as there. Every file's
// first bytes are read to tell JPEG and PNG apart from anything else.
// `skipped` (optional) receives the count of skipped files. Throws
// DataError naming the folder, list line or file.
Dataset open_image_folder(const ImageFolderOptions& options, const Shape& shape,
                          int64_t* skipped = nullptr);

// The samples of WebDataset tar shards: `patterns` may hold brace ranges
// (train-{000000..000146}.tar). A shard's sample list comes from its index
// (<shard>.idx, written by pack_shards) when there is one, else from
// reading its tar headers. Throws DataError naming the shard and member.
Dataset open_shards(const std::vector<std::string>& patterns, const Shape& shape);

// "a-{00..02}.tar" -> a-00.tar, a-01.tar, a-02.tar (ranges keep the
// width of their first bound; several braces multiply). Throws DataError
// for an unclosed or malformed brace.
std::vector<std::string> expand_braces(const std::string& pattern);

struct PackOptions {
  std::string out_prefix;          // shards are <out_prefix>-000000.tar, ...
  int64_t samples_per_shard = 10000;
  int64_t max_side = 0;            // > 0: JPEGs whose larger side exceeds it are stored resized
  int quality = 90;                // JPEG quality of resized images
};

// What pack_shards wrote.
struct PackResult {
  std::vector<std::string> shards;
  int64_t samples = 0;
  int64_t resized = 0;  // images stored smaller (max_side)
  int64_t bytes = 0;    // shard bytes written
};

// Packs `data` into tar shards with an index per shard (<shard>.idx): file
// datasets copy each image's bytes (or re-encode it smaller, max_side);
// in-memory ones (IDX, CIFAR-10) store each sample as a PNG. Shards are
// written to a temporary name and renamed when complete. Throws DataError.
PackResult pack_shards(const Dataset& data, const PackOptions& options);

}  // namespace vtrain::worker
