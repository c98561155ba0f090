#include "worker/data/tar_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "worker/data/data.h"

namespace vtrain::worker {
namespace {

constexpr int64_t kBlock = 512;

int64_t round_up(int64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// A numeric header field: octal text, or base-256 when its top bit is set
// (GNU tar's form for sizes of 8 GiB and more). -1 when malformed.
int64_t header_number(const uint8_t* field, size_t width) {
  if (field[0] & 0x80) {
    int64_t n = field[0] & 0x3F;
    for (size_t i = 1; i < width; ++i) n = (n << 8) | field[i];
    return n;
  }
  int64_t n = 0;
  size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  bool any = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i, any = true) n = n * 8 + (field[i] - '0');
  for (; i < width; ++i) {
    if (field[i] != ' ' && field[i] != '\0') return -1;
  }
  return any ? n : -1;
}

std::string header_text(const uint8_t* field, size_t width) {
  return std::string(reinterpret_cast<const char*>(field),
                     strnlen(reinterpret_cast<const char*>(field), width));
}

bool checksum_ok(const uint8_t* h) {
  int64_t sum = 0;
  for (int64_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  return header_number(h + 148, 8) == sum;
}

// The "path" record of a pax extended header ("<len> path=<value>\n"...).
std::string pax_path(const std::string& records) {
  size_t at = 0;
  while (at < records.size()) {
    const size_t space = records.find(' ', at);
    if (space == std::string::npos) break;
    const int64_t length = std::atoll(records.c_str() + at);
    if (length <= 0 || at + static_cast<size_t>(length) > records.size()) break;
    const std::string record = records.substr(space + 1, at + length - space - 2);
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    at += static_cast<size_t>(length);
  }
  return {};
}

// A tar member: its name and its data's place.
struct Member {
  std::string name;
  int64_t offset = 0, size = 0;
};

class TarReader {
 public:
  explicit TarReader(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw DataError(path + ": cannot open: " + std::strerror(errno));
    size_ = ::lseek(fd_, 0, SEEK_END);
  }
  ~TarReader() { ::close(fd_); }
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;

  [[noreturn]] void fail(const std::string& what) const { throw DataError(path_ + ": " + what); }

  // The next regular file; nullopt at the end of the archive.
  std::optional<Member> next() {
    std::string long_name;
    for (;;) {
      if (at_ + kBlock > size_) {
        if (at_ == size_) return std::nullopt;  // no end blocks: tolerated, as tar does
        fail("truncated tar: a partial header at byte " + std::to_string(at_));
      }
      std::array<uint8_t, kBlock> h{};
      read(h.data(), kBlock, at_);
      if (std::all_of(h.begin(), h.end(), [](uint8_t b) { return b == 0; })) return std::nullopt;
      if (!checksum_ok(h.data()))
        fail("corrupt tar header at byte " + std::to_string(at_) + " (bad checksum)");
      const int64_t size = header_number(h.data() + 124, 12);
      if (size < 0) fail("corrupt tar header at byte " + std::to_string(at_) + " (bad size field)");
      std::string name = header_text(h.data(), 100);
      if (std::memcmp(h.data() + 257, "ustar", 5) == 0 && h[345] != 0)
        name = header_text(h.data() + 345, 155) + "/" + name;
      if (!long_name.empty()) name = long_name;
      const int64_t data = at_ + kBlock;
      if (data + size > size_) {
        fail("truncated tar: member " + name + " needs " + std::to_string(size) + " bytes at byte " +
             std::to_string(data) + ", the file has " + std::to_string(size_ - data));
      }
      at_ = data + round_up(size);
      const char type = static_cast<char>(h[156]);
      if (type == 'L' || type == 'x') {
        std::string text(static_cast<size_t>(std::min<int64_t>(size, 1 << 20)), '\0');
        read(text.data(), static_cast<int64_t>(text.size()), data);
        long_name = type == 'L' ? header_text(reinterpret_cast<const uint8_t*>(text.data()), text.size())
                                : pax_path(text);
        continue;
      }
      if (type == '0' || type == '\0' || type == '7') return Member{name, data, size};
      long_name.clear();  // directories, links, global pax headers: nothing to read
    }
  }

  void read(void* dst, int64_t size, int64_t offset) const {
    if (!read_exactly(fd_, dst, size, offset)) {
      fail("cannot read " + std::to_string(size) + " bytes at byte " + std::to_string(offset) + ": " +
           (errno != 0 ? std::strerror(errno) : "the file ends first"));
    }
  }

 private:
  std::string path_;
  int fd_;
  int64_t size_ = 0;
  int64_t at_ = 0;
};

// WebDataset's key and extension: the name split at the first dot of its
// last path component.
std::pair<std::string, std::string> key_and_extension(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) return {name, ""};
  std::string ext = name.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return {name.substr(0, dot), ext};
}

std::optional<int32_t> parse_label(const std::string& text) {
  const size_t b = text.find_first_not_of(" \t\r\n");
  const size_t e = text.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return std::nullopt;
  const std::string digits = text.substr(b, e - b + 1);
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return static_cast<int32_t>(std::stol(digits));
}

}  // namespace

bool read_exactly(int fd, void* dst, int64_t size, int64_t offset) {
  auto* out = static_cast<uint8_t*>(dst);
  while (size > 0) {
    const ssize_t n = ::pread(fd, out, static_cast<size_t>(size), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = 0;
      return false;
    }
    out += n;
    size -= n;
    offset += n;
  }
  return true;
}

std::vector<ShardSample> scan_shard(const std::string& path) {
  TarReader tar(path);
  struct Pending {
    std::optional<Member> image;
    std::optional<int32_t> label;
    std::string cls;
  };
  std::vector<std::string> order;
  std::map<std::string, Pending> keys;
  while (std::optional<Member> m = tar.next()) {
    auto [key, ext] = key_and_extension(m->name);
    const bool image = ext == "jpg" || ext == "jpeg" || ext == "png";
    if (!image && ext != "cls") continue;
    auto [it, added] = keys.try_emplace(key);
    if (added) order.push_back(key);
    if (image) {
      if (it->second.image)
        tar.fail("key " + key + " has two images (" + it->second.image->name + ", " + m->name + ")");
      it->second.image = *m;
    } else {
      std::string text(static_cast<size_t>(std::min<int64_t>(m->size, 64)), '\0');
      tar.read(text.data(), static_cast<int64_t>(text.size()), m->offset);
      it->second.label = parse_label(text);
      if (!it->second.label || m->size > 64)
        tar.fail("member " + m->name + ": expected a label (a number >= 0), got '" + text + "'");
      it->second.cls = m->name;
    }
  }
  std::vector<ShardSample> samples;
  for (const std::string& key : order) {
    const Pending& p = keys[key];
    if (!p.image) tar.fail("member " + p.cls + " labels key " + key + ", which has no .jpg, .jpeg or .png");
    if (!p.label) tar.fail("member " + p.image->name + " has no label (expected " + key + ".cls)");
    samples.push_back({p.image->offset, p.image->size, *p.label, p.image->name});
  }
  return samples;
}

std::string shard_index_path(const std::string& shard) { return shard + ".idx"; }

std::optional<std::vector<ShardSample>> read_shard_index(const std::string& shard) {
  const std::string path = shard_index_path(shard);
  std::ifstream in(path);
  if (!in) return std::nullopt;
  auto fail = [&](int64_t line, const std::string& what) -> DataError {
    return DataError(path + ":" + std::to_string(line) + ": " + what);
  };
  std::string magic;
  int version = 0;
  int64_t bytes = -1;
  if (!(in >> magic >> version >> bytes) || magic != "vtrain-shard-index" || version != 1) {
    throw fail(1, "expected 'vtrain-shard-index 1 <shard bytes>' (an index written by vtrain data pack)");
  }
  std::error_code ec;
  const auto actual = static_cast<int64_t>(std::filesystem::file_size(shard, ec));
  if (ec || actual != bytes) {
    throw fail(1, "written for a shard of " + std::to_string(bytes) + " bytes, " + shard + " has " +
                      (ec ? "none (" + ec.message() + ")" : std::to_string(actual)) +
                      ": pack the shard again or delete the stale index");
  }
  std::vector<ShardSample> samples;
  std::string line;
  std::getline(in, line);
  for (int64_t number = 2; std::getline(in, line); ++number) {
    std::istringstream words(line);
    ShardSample s;
    if (!(words >> s.offset >> s.size >> s.label) || !std::getline(words >> std::ws, s.member) ||
        s.member.empty() || s.offset < 0 || s.size < 0 || s.label < 0 || s.offset + s.size > bytes) {
      throw fail(number, "expected '<offset> <size> <label> <member>' within the shard, got '" + line + "'");
    }
    samples.push_back(std::move(s));
  }
  return samples;
}

TarWriter::TarWriter(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "wb")) {
  if (!file_) throw DataError(path + ": cannot create: " + std::strerror(errno));
}

TarWriter::~TarWriter() {
  if (file_) std::fclose(file_);
}

void TarWriter::write(const void* data, size_t size) {
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
    throw DataError(path_ + ": cannot write: " + std::strerror(errno));
  }
  at_ += static_cast<int64_t>(size);
}

int64_t TarWriter::add(const std::string& name, std::span<const uint8_t> data) {
  if (name.size() > 99) throw DataError(path_ + ": member name longer than 99 bytes: " + name);
  std::array<char, kBlock> h{};
  std::memcpy(h.data(), name.data(), name.size());
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 108, 8, "%07o", 0);
  std::snprintf(h.data() + 116, 8, "%07o", 0);
  std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(data.size()));
  std::snprintf(h.data() + 136, 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(h.data() + 257, "ustar", 6);
  std::memcpy(h.data() + 263, "00", 2);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  write(h.data(), h.size());
  const int64_t offset = at_;
  write(data.data(), data.size());
  static const std::array<char, kBlock> zeros{};
  write(zeros.data(), static_cast<size_t>(round_up(at_) - at_));
  return offset;
}

int64_t TarWriter::finish() {
  static const std::array<char, 2 * kBlock> zeros{};
  write(zeros.data(), zeros.size());
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) {
    throw DataError(path_ + ": cannot write: " + std::strerror(errno));
  }
  std::fclose(std::exchange(file_, nullptr));
  return at_;
}

void write_shard_index(const std::string& shard, int64_t shard_bytes,
                       const std::vector<ShardSample>& samples) {
  const std::string path = shard_index_path(shard);
  std::ofstream out(path + ".tmp");
  out << "vtrain-shard-index 1 " << shard_bytes << "\n";
  for (const ShardSample& s : samples)
    out << s.offset << ' ' << s.size << ' ' << s.label << ' ' << s.member << '\n';
  out.close();
  if (!out) throw DataError(path + ".tmp: cannot write");
  std::filesystem::rename(path + ".tmp", path);
}

}  // namespace vtrain::worker
