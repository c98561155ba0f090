#include "worker/data/image_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "worker/data/image_decoder.h"
#include "worker/data/tar_file.h"

namespace vtrain::worker {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// ImageFiles.

ImageFiles::~ImageFiles() {
  for (int fd : shard_fds_) ::close(fd);
}

void ImageFiles::add_file(std::string path) {
  entries_.push_back({-1, static_cast<int32_t>(paths_.size()), 0, 0});
  paths_.push_back(std::move(path));
}

int32_t ImageFiles::add_shard(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open: " + std::strerror(errno));
  shards_.push_back(path);
  shard_fds_.push_back(fd);
  return static_cast<int32_t>(shards_.size() - 1);
}

void ImageFiles::add_member(int32_t shard, int64_t offset, int64_t size, std::string member) {
  entries_.push_back({shard, static_cast<int32_t>(members_.size()), offset, size});
  members_.push_back(std::move(member));
}

std::string ImageFiles::describe(int64_t i) const {
  const Entry& e = entries_.at(static_cast<size_t>(i));
  if (e.shard < 0) return paths_[e.name];
  return shards_[e.shard] + ": member " + members_[e.name];
}

ImageFiles::Location ImageFiles::location(int64_t i) const {
  const Entry& e = entries_.at(static_cast<size_t>(i));
  return e.shard < 0 ? Location{-1, i} : Location{e.shard, e.offset};
}

void ImageFiles::read(int64_t i, std::vector<uint8_t>& bytes) const {
  const Entry& e = entries_.at(static_cast<size_t>(i));
  if (e.shard >= 0) {
    bytes.resize(static_cast<size_t>(e.size));
    if (!read_exactly(shard_fds_[e.shard], bytes.data(), e.size, e.offset)) {
      throw DataError(describe(i) + ": cannot read " + std::to_string(e.size) + " bytes at offset " +
                      std::to_string(e.offset) + " (" +
                      (errno != 0 ? std::strerror(errno) : "the shard is shorter") + ")");
    }
    return;
  }
  const std::string& path = paths_[e.name];
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open: " + std::strerror(errno));
  std::string error;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size < 0) {
    error = std::strerror(errno);
  } else {
    bytes.resize(static_cast<size_t>(size));
    if (!read_exactly(fd, bytes.data(), size, 0)) error = errno != 0 ? std::strerror(errno) : "it shrank";
  }
  ::close(fd);
  if (!error.empty()) throw DataError(path + ": cannot read: " + error);
}

// ---------------------------------------------------------------------------
// Brace patterns.

std::vector<std::string> expand_braces(const std::string& pattern) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    if (pattern.find('}') != std::string::npos) throw DataError(pattern + ": '}' without '{'");
    return {pattern};
  }
  const size_t close = pattern.find('}', open);
  const size_t dots = pattern.find("..", open);
  if (close == std::string::npos || dots == std::string::npos || dots > close) {
    throw DataError(pattern + ": expected a brace range such as {000000..000146}");
  }
  const std::string lo = pattern.substr(open + 1, dots - open - 1);
  const std::string hi = pattern.substr(dots + 2, close - dots - 2);
  auto number = [&](const std::string& s) {
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) {
      throw DataError(pattern + ": brace range bound '" + s + "' is not a number");
    }
    return std::stoll(s);
  };
  const int64_t first = number(lo), last = number(hi);
  if (last < first) throw DataError(pattern + ": brace range runs backwards");
  std::vector<std::string> out;
  for (int64_t n = first; n <= last; ++n) {
    std::string digits = std::to_string(n);
    if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
    for (std::string& rest : expand_braces(pattern.substr(close + 1))) {
      out.push_back(pattern.substr(0, open) + digits + rest);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Image folders.

namespace {

// The first bytes of `path`, enough to tell its format.
ImageFormat file_format(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open: " + std::strerror(errno));
  uint8_t head[8] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  return sniff_image({head, static_cast<size_t>(in.gcount())});
}

// Adds `path` unless it is neither JPEG nor PNG: then fails, or counts it.
bool accept_image(const std::string& path, bool skip, int64_t& skipped) {
  if (file_format(path) != ImageFormat::kUnknown) return true;
  if (!skip) {
    throw DataError(path +
                    ": not a JPEG or PNG image (by its first bytes); remove it, or set "
                    "data.skip_unreadable: true to skip such files");
  }
  ++skipped;
  return false;
}

std::vector<fs::path> sorted_entries(const fs::path& dir, bool folders) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec) == folders) out.push_back(it->path());
  }
  if (ec) throw DataError(dir.string() + ": cannot list: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

// The files under `dir`, recursively, in sorted order at every level.
void walk_sorted(const fs::path& dir, std::vector<std::string>& files) {
  for (const fs::path& f : sorted_entries(dir, false)) files.push_back(f.string());
  for (const fs::path& sub : sorted_entries(dir, true)) walk_sorted(sub, files);
}

void read_folders(const ImageFolderOptions& o, Dataset& data, ImageFiles& files, int64_t& skipped) {
  std::error_code ec;
  if (!fs::is_directory(o.dir, ec))
    throw DataError(o.dir + ": not a folder (expected <class>/<image> inside)");
  const std::vector<fs::path> classes = sorted_entries(o.dir, true);
  if (classes.empty()) throw DataError(o.dir + ": has no class folders (expected <class>/<image> inside)");
  for (size_t label = 0; label < classes.size(); ++label) {
    std::vector<std::string> paths;
    walk_sorted(classes[label], paths);
    const int64_t first = data.count;
    for (std::string& path : paths) {
      if (!accept_image(path, o.skip_unreadable, skipped)) continue;
      files.add_file(std::move(path));
      data.labels.push_back(static_cast<int32_t>(label));
      ++data.count;
    }
    data.sources.push_back({classes[label].string(), first, data.count - first});
  }
  data.classes = static_cast<int64_t>(classes.size());
}

void read_list(const ImageFolderOptions& o, Dataset& data, ImageFiles& files, int64_t& skipped) {
  std::ifstream in(o.list);
  if (!in) throw DataError(o.list + ": cannot open: " + std::strerror(errno));
  const fs::path base = o.dir.empty() ? fs::path(o.list).parent_path() : fs::path(o.dir);
  std::string line;
  int64_t max_label = -1;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    std::istringstream words(line);
    std::string path, extra;
    int64_t label = -1;
    if (!(words >> path >> label) || (words >> extra) || label < 0 || label > INT32_MAX) {
      throw DataError(o.list + ":" + std::to_string(number) +
                      ": expected 'path label' (a label >= 0), got '" + line + "'");
    }
    const std::string full = fs::path(path).is_absolute() ? path : (base / path).string();
    if (!accept_image(full, o.skip_unreadable, skipped)) continue;
    files.add_file(full);
    data.labels.push_back(static_cast<int32_t>(label));
    max_label = std::max(max_label, label);
    ++data.count;
  }
  if (data.count == 0) throw DataError(o.list + ": lists no images");
  data.classes = max_label + 1;
  data.sources.push_back({o.list, 0, data.count});
}

}  // namespace

Dataset open_image_folder(const ImageFolderOptions& options, const Shape& shape, int64_t* skipped) {
  Dataset data;
  data.sample = {1, shape.c, shape.h, shape.w};
  auto files = std::make_shared<ImageFiles>();
  int64_t skips = 0;
  if (options.list.empty()) {
    read_folders(options, data, *files, skips);
  } else {
    read_list(options, data, *files, skips);
  }
  if (data.count == 0) {
    throw DataError(options.dir + ": no JPEG or PNG images" +
                    (skips > 0 ? " (" + std::to_string(skips) + " other files skipped)" : ""));
  }
  if (skipped) *skipped = skips;
  data.files = std::move(files);
  return data;
}

// ---------------------------------------------------------------------------
// Shards.

namespace {

// A shard's samples: from its index when there is one, else its tar headers.
void read_shard(const std::string& shard, Dataset& data, ImageFiles& files) {
  const int32_t number = files.add_shard(shard);
  const int64_t first = data.count;
  auto add = [&](const ShardSample& s) {
    files.add_member(number, s.offset, s.size, s.member);
    data.labels.push_back(s.label);
    ++data.count;
  };
  if (std::optional<std::vector<ShardSample>> indexed = read_shard_index(shard)) {
    for (const ShardSample& s : *indexed) add(s);
  } else {
    for (const ShardSample& s : scan_shard(shard)) add(s);
  }
  if (data.count == first) throw DataError(shard + ": holds no <key>.jpg|.png with a <key>.cls");
  data.sources.push_back({shard, first, data.count - first});
}

}  // namespace

Dataset open_shards(const std::vector<std::string>& patterns, const Shape& shape) {
  Dataset data;
  data.sample = {1, shape.c, shape.h, shape.w};
  auto files = std::make_shared<ImageFiles>();
  for (const std::string& pattern : patterns) {
    for (const std::string& shard : expand_braces(pattern)) read_shard(shard, data, *files);
  }
  if (data.count == 0) throw DataError("no shards given");
  data.classes = *std::max_element(data.labels.begin(), data.labels.end()) + 1;
  data.files = std::move(files);
  return data;
}

}  // namespace vtrain::worker
