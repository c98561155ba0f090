// Tar shards (internal to the data part): reading members' places from tar
// headers or from a shard's index, and writing shards and indexes.
// Tar headers are parsed here (ustar, with GNU long names and pax paths)
// rather than through libarchive: a rank needs each member's byte offset
// in the shard to pread() it later, which libarchive's streaming reader
// does not give.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace vtrain::worker {

// pread()s exactly `size` bytes at `offset`; false on an error (errno set)
// or when the file ends first (errno 0).
bool read_exactly(int fd, void* dst, int64_t size, int64_t offset);

// One sample of a shard: its image member's bytes and label.
struct ShardSample {
  int64_t offset = 0, size = 0;  // the image member's data in the shard
  int32_t label = 0;             // from <key>.cls
  std::string member;            // the image member's name
};

// The samples of tar file `path`, in order, from its headers: members
// <key>.jpg|.jpeg|.png paired with <key>.cls (a decimal label); other
// members are ignored. Throws DataError naming the shard (and member) for a
// corrupt or truncated tar, an image without a label or a label without an
// image.
std::vector<ShardSample> scan_shard(const std::string& path);

// The index <shard>.idx when it exists; nullopt when it does not. Throws
// DataError when it is malformed or was written for a shard of another size.
std::optional<std::vector<ShardSample>> read_shard_index(const std::string& shard);
std::string shard_index_path(const std::string& shard);

// Writes a tar file member by member (ustar headers).
class TarWriter {
 public:
  explicit TarWriter(const std::string& path);  // truncates
  ~TarWriter();
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;
  // Appends a member; returns its data's offset.
  int64_t add(const std::string& name, std::span<const uint8_t> data);
  // The end blocks, flushed and synced; returns the file's size.
  int64_t finish();

 private:
  void write(const void* data, size_t size);
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t at_ = 0;
};

// Writes <shard>.idx for a finished shard of `shard_bytes` bytes.
void write_shard_index(const std::string& shard, int64_t shard_bytes,
                       const std::vector<ShardSample>& samples);

}  // namespace vtrain::worker
