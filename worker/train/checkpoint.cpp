#include "worker/train/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <map>
#include <random>
#include <regex>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "common/files.h"

namespace vtrain::worker {
namespace {

namespace fs = std::filesystem;

constexpr std::array<uint8_t, 8> kMagic = {'V', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
// 2 added epoch_sample and split, 3 loss_scaler, 4 the run, 5 the optimizer's
// second moment and update count and the weight average.
constexpr uint32_t kVersion = 5;
constexpr size_t kHeaderBytes = kMagic.size() + 4;  // magic, version
constexpr size_t kTrailerBytes = 4;                 // CRC-32
constexpr int64_t kMaxStep = 9'999'999'999;         // the most 10 digits hold
// Granularity of file I/O: large enough that syscalls are negligible, small
// enough that saving never holds a second copy of the model in memory.
constexpr size_t kChunkBytes = size_t{1} << 20;

std::string errno_text(int err) { return std::strerror(err); }

// Throws "PATH: WHAT: strerror(err)". Callers capture errno first: building
// the message allocates, and allocation may overwrite errno.
[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw CheckpointError(path + ": " + what + ": " + errno_text(err));
}

void store_le(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t load_le(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

using common::Fd;

// Encodes values little-endian into a chunk buffer and writes full chunks
// out, keeping the CRC-32 of everything written before the trailer.
class ChunkWriter {
 public:
  explicit ChunkWriter(common::OutputFile& out) : out_(out), buf_(kChunkBytes) {}

  void u32(uint32_t value) { put(value, 4); }
  void u64(uint64_t value) { put(value, 8); }
  void i64(int64_t value) { put(static_cast<uint64_t>(value), 8); }

  void str(const std::string& text) {
    u64(text.size());
    for (char c : text) put(static_cast<uint8_t>(c), 1);
  }

  void bytes(const uint8_t* data, size_t n) {
    for (size_t i = 0; i < n; ++i) put(data[i], 1);
  }

  // Floats travel as their IEEE-754 bit patterns, so NaN payloads and -0.0
  // come back bit for bit.
  void floats(const std::vector<float>& values) {
    u64(values.size());
    for (float v : values) put(std::bit_cast<uint32_t>(v), 4);
  }

  void ints(const std::vector<int64_t>& values) {
    u64(values.size());
    for (int64_t v : values) i64(v);
  }

  // Writes what is buffered and then the CRC-32 trailer.
  void finish() {
    flush();
    store_le(buf_.data(), crc_, 4);
    used_ = 4;
    write_out();
  }

 private:
  void put(uint64_t value, int n) {
    if (used_ + static_cast<size_t>(n) > buf_.size()) flush();
    store_le(buf_.data() + used_, value, n);
    used_ += static_cast<size_t>(n);
  }

  void flush() {
    crc_ = crc32_z(crc_, buf_.data(), used_);
    write_out();
  }

  void write_out() {
    out_.write(buf_.data(), used_);
    used_ = 0;
  }

  common::OutputFile& out_;
  std::vector<uint8_t> buf_;
  size_t used_ = 0;
  uLong crc_ = crc32_z(0, nullptr, 0);
};

// Reads a checkpoint front to back, checking every declared length against
// the bytes left before the CRC trailer before it reads or allocates, and
// keeping the CRC-32 of what it read.
class ChunkReader {
 public:
  ChunkReader(int fd, const std::string& path, uint64_t file_size)
      : fd_(fd),
        path_(path),
        file_size_(file_size),
        body_end_(file_size >= kTrailerBytes ? file_size - kTrailerBytes : 0) {}

  // Bytes left before the trailer.
  uint64_t remaining() const { return pos_ < body_end_ ? body_end_ - pos_ : 0; }
  uLong crc() const { return crc_; }

  // Reads n bytes that the caller has checked the file holds.
  void read(uint8_t* out, size_t n) {
    read_raw(out, n);
    crc_ = crc32_z(crc_, out, n);
  }

  uint32_t u32(const char* field) { return static_cast<uint32_t>(fixed(field, 4)); }
  uint64_t u64(const char* field) { return fixed(field, 8); }
  int64_t i64(const char* field) { return static_cast<int64_t>(fixed(field, 8)); }

  std::string str(const char* field) {
    const uint64_t length = u64(field);
    if (length > remaining()) {
      throw error("truncated: field " + std::string(field) + " declares " +
                  std::to_string(length) + " bytes but only " + std::to_string(remaining()) +
                  " bytes remain");
    }
    std::string text(length, '\0');
    read(reinterpret_cast<uint8_t*>(text.data()), text.size());
    return text;
  }

  std::vector<float> floats(const char* field) {
    const uint64_t count = array_count(field, 4, "floats");
    std::vector<float> values(count);
    std::vector<uint8_t> chunk(std::min<uint64_t>(count * 4, kChunkBytes));
    for (size_t done = 0; done < values.size();) {
      const size_t n = std::min(values.size() - done, chunk.size() / 4);
      read(chunk.data(), n * 4);
      for (size_t i = 0; i < n; ++i) {
        values[done + i] = std::bit_cast<float>(static_cast<uint32_t>(load_le(&chunk[i * 4], 4)));
      }
      done += n;
    }
    return values;
  }

  std::vector<int64_t> ints(const char* field) {
    std::vector<int64_t> values(array_count(field, 8, "integers"));
    for (int64_t& v : values) v = i64(field);
    return values;
  }

  // Key and value strings, each at least its 8-byte length.
  std::vector<RunSetting> settings(const char* field) {
    std::vector<RunSetting> values(array_count(field, 16, "settings"));
    for (RunSetting& v : values) {
      v.key = str(field);
      v.value = str(field);
    }
    return values;
  }

  // The stored CRC; call once every field is read and remaining() is 0.
  uint32_t trailer() {
    std::array<uint8_t, kTrailerBytes> bytes{};
    read_raw(bytes.data(), bytes.size());
    return static_cast<uint32_t>(load_le(bytes.data(), 4));
  }

  CheckpointError error(const std::string& what) const {
    return CheckpointError(path_ + ": " + what);
  }

 private:
  // An array's length, checked against the bytes left before allocating:
  // compared by division so a corrupt count near 2^64 cannot overflow.
  uint64_t array_count(const char* field, uint64_t bytes_each, const char* what) {
    const uint64_t count = u64(field);
    if (count > remaining() / bytes_each) {
      throw error("truncated: field " + std::string(field) + " declares " +
                  std::to_string(count) + " " + what + " but only " +
                  std::to_string(remaining()) + " bytes remain");
    }
    return count;
  }

  uint64_t fixed(const char* field, int n) {
    if (remaining() < static_cast<uint64_t>(n)) {
      throw error("truncated: field " + std::string(field) + " needs " + std::to_string(n) +
                  " bytes but only " + std::to_string(remaining()) + " bytes remain");
    }
    std::array<uint8_t, 8> bytes{};
    read(bytes.data(), static_cast<size_t>(n));
    return load_le(bytes.data(), n);
  }

  void read_raw(uint8_t* out, size_t n) {
    while (n > 0) {
      const ssize_t got = ::read(fd_, out, n);
      if (got < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        fail(path_, "read failed", err);
      }
      // The file shrank after fstat (another process is rewriting it).
      if (got == 0) {
        throw error("truncated: file ended at byte " + std::to_string(pos_) + " of " +
                    std::to_string(file_size_));
      }
      out += got;
      n -= static_cast<size_t>(got);
      pos_ += static_cast<uint64_t>(got);
    }
  }

  int fd_;
  const std::string& path_;
  uint64_t file_size_;
  uint64_t body_end_;
  uint64_t pos_ = 0;
  uLong crc_ = crc32_z(0, nullptr, 0);
};

struct ListedCheckpoint {
  int64_t step;
  fs::path path;
};

// The step of a file named ckpt-<10 digits>.vtc; nullopt for any other name.
std::optional<int64_t> checkpoint_step(const std::string& name) {
  constexpr std::string_view kPrefix = "ckpt-";
  constexpr std::string_view kSuffix = ".vtc";
  constexpr size_t kDigits = 10;
  if (name.size() != kPrefix.size() + kDigits + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix)) {
    return std::nullopt;
  }
  int64_t step = 0;
  for (char c : name.substr(kPrefix.size(), kDigits)) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

// The ckpt-<10 digits>.vtc names in `dir`, ascending by step; nullopt when
// `dir` does not exist. Temporaries and other files are ignored.
std::optional<std::vector<ListedCheckpoint>> list_checkpoints(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return std::nullopt;
  std::vector<ListedCheckpoint> found;
  for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    if (const auto step = checkpoint_step(it->path().filename().string())) {
      found.push_back({*step, it->path()});
    }
  }
  if (ec) throw CheckpointError(dir + ": cannot list checkpoint directory: " + ec.message());
  std::sort(found.begin(), found.end(),
            [](const ListedCheckpoint& a, const ListedCheckpoint& b) { return a.step < b.step; });
  return found;
}

std::string checkpoint_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%010lld.vtc", static_cast<long long>(step));
  return name;
}

void write_checkpoint(common::OutputFile& file, const Checkpoint& ckpt) {
  ChunkWriter out(file);
  out.bytes(kMagic.data(), kMagic.size());
  out.u32(kVersion);
  out.str(ckpt.run_id);
  out.u64(ckpt.settings.size());
  for (const RunSetting& s : ckpt.settings) {
    out.str(s.key);
    out.str(s.value);
  }
  out.str(ckpt.model_signature);
  out.i64(ckpt.step);
  out.i64(ckpt.epoch);
  out.i64(ckpt.step_in_epoch);
  out.u64(ckpt.seed);
  out.i64(ckpt.world_size);
  out.i64(ckpt.global_batch);
  out.i64(ckpt.epoch_sample);
  out.ints(ckpt.split);
  out.floats(ckpt.parameters);
  out.floats(ckpt.buffers);
  out.floats(ckpt.velocity);
  out.u32(ckpt.loss_scaler ? 1 : 0);
  if (const auto& s = ckpt.loss_scaler) {
    out.u64(std::bit_cast<uint64_t>(s->scale));
    out.i64(s->clean_steps);
    out.i64(s->skipped_steps);
  }
  out.floats(ckpt.second_moment);
  out.i64(ckpt.optimizer_updates);
  out.floats(ckpt.weight_average);
  out.finish();
}

uint64_t file_size(const Fd& fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(path, "stat failed", errno);
  return static_cast<uint64_t>(st.st_size);
}

// Reads and checks the magic and the version of a file of `size` bytes;
// returns the version. Bounded by the file size rather than the trailer, so that any short file that is
// not a checkpoint is reported as such.
uint32_t read_header(ChunkReader& in, uint64_t size) {
  std::array<uint8_t, kHeaderBytes> header{};
  const size_t have = static_cast<size_t>(std::min<uint64_t>(size, header.size()));
  in.read(header.data(), have);
  if (!std::equal(header.begin(), header.begin() + std::min(have, kMagic.size()), kMagic.begin())) {
    throw in.error("not a vtrain checkpoint (bad magic)");
  }
  if (have < header.size()) {
    throw in.error("truncated: " + std::to_string(size) + " bytes, shorter than the " +
                   std::to_string(kHeaderBytes) + "-byte header");
  }
  const uint32_t version = static_cast<uint32_t>(load_le(&header[kMagic.size()], 4));
  if (version > kVersion) {
    throw in.error("version " + std::to_string(version) + " is newer than this vtrain's " +
                   std::to_string(kVersion));
  }
  if (version == 0) throw in.error("invalid version 0");
  return version;
}

// The run id in the first bytes of the checkpoint at `path` ("" before
// version 4); nullopt when the file cannot be read as a checkpoint. Not
// validated by its CRC: only pruning and the start of a run look here, and
// both leave a file alone that they cannot attribute.
std::optional<std::string> stored_run_id(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  try {
    const uint64_t size = file_size(fd, path);
    ChunkReader in(fd.get(), path, size);
    return read_header(in, size) >= 4 ? in.str("run_id") : std::string();
  } catch (const CheckpointError&) {
    return std::nullopt;
  }
}

// Removes all but `keep` checkpoints of the run that wrote `written`: it
// and the highest-numbered others of its run id. Another run's files, and
// files whose run cannot be read, stay. Tries every removal before
// reporting the ones that failed.
void prune_checkpoints(const std::string& dir, const fs::path& written, int keep) {
  const auto listed = list_checkpoints(dir);
  const std::optional<std::string> run = stored_run_id(written.string());
  if (!listed || !run) return;
  int kept = 1;  // `written` itself
  std::string failures;
  for (auto it = listed->rbegin(); it != listed->rend(); ++it) {
    if (it->path == written || stored_run_id(it->path.string()) != run) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove(it->path, ec);
    if (ec) failures += "; " + it->path.string() + ": " + ec.message();
  }
  if (!failures.empty()) {
    throw CheckpointError(written.string() +
                          " was saved, but old checkpoints could not be removed" + failures);
  }
}

// Version 3's loss_scaler field: a flag, then the state if it is 1.
std::optional<LossScalerState> read_loss_scaler(ChunkReader& in) {
  const uint32_t present = in.u32("loss_scaler");
  if (present > 1) {
    throw in.error("field loss_scaler: flag must be 0 or 1, got " + std::to_string(present));
  }
  if (present == 0) return std::nullopt;
  LossScalerState state;
  state.scale = std::bit_cast<double>(in.u64("loss_scaler.scale"));
  state.clean_steps = in.i64("loss_scaler.clean_steps");
  state.skipped_steps = in.i64("loss_scaler.skipped_steps");
  return state;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const Checkpoint& ckpt, int keep) {
  if (keep < 1) {
    throw std::invalid_argument("save_checkpoint: keep must be >= 1, got " + std::to_string(keep));
  }
  if (ckpt.step < 0 || ckpt.step > kMaxStep) {
    throw std::invalid_argument("save_checkpoint: step must be in [0, " +
                                std::to_string(kMaxStep) + "], got " + std::to_string(ckpt.step));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError(dir + ": cannot create checkpoint directory: " + ec.message());

  const fs::path final_path = fs::path(dir) / checkpoint_name(ckpt.step);
  // Durable: fsync of the data before the rename publishes it, then of DIR.
  // Pruning waits until then: if a sync fails, the older checkpoints are
  // the ones a crash is sure to keep.
  common::OutputFile file(final_path.string(), "checkpoint", common::OutputFile::Sync::kDurable);
  write_checkpoint(file, ckpt);
  file.commit();
  prune_checkpoints(dir, final_path, keep);
  return final_path.string();
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  const auto listed = list_checkpoints(dir);
  if (!listed || listed->empty()) return std::nullopt;
  return listed->back().path.string();
}

std::string checkpoint_at(const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) {
    throw CheckpointError("checkpoint " + path + " does not exist (give a checkpoint file, "
                          "ckpt-<step>.vtc, or the checkpoint.dir folder that holds them)");
  }
  if (!fs::is_directory(status)) return path;
  if (std::optional<std::string> newest = latest_checkpoint(path)) return *newest;
  throw CheckpointError("checkpoint folder " + path + " holds no checkpoint (ckpt-<step>.vtc)");
}

Checkpoint load_checkpoint(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) fail(path, "cannot open", errno);
  const uint64_t size = file_size(fd, path);
  ChunkReader in(fd.get(), path, size);
  const uint32_t version = read_header(in, size);

  Checkpoint ckpt;
  if (version >= 4) {
    ckpt.run_id = in.str("run_id");
    ckpt.settings = in.settings("settings");
  }
  ckpt.model_signature = in.str("model_signature");
  ckpt.step = in.i64("step");
  ckpt.epoch = in.i64("epoch");
  ckpt.step_in_epoch = in.i64("step_in_epoch");
  ckpt.seed = in.u64("seed");
  ckpt.world_size = in.i64("world_size");
  ckpt.global_batch = in.i64("global_batch");
  if (version >= 2) {
    ckpt.epoch_sample = in.i64("epoch_sample");
    ckpt.split = in.ints("split");
  } else {
    ckpt.epoch_sample = ckpt.step_in_epoch * ckpt.global_batch;
  }
  ckpt.parameters = in.floats("parameters");
  ckpt.buffers = in.floats("buffers");
  ckpt.velocity = in.floats("velocity");
  if (version >= 3) ckpt.loss_scaler = read_loss_scaler(in);
  if (version >= 5) {
    ckpt.second_moment = in.floats("second_moment");
    ckpt.optimizer_updates = in.i64("optimizer_updates");
    ckpt.weight_average = in.floats("weight_average");
  } else {
    ckpt.optimizer_updates = ckpt.step;  // SGD's: every step updated
  }
  if (in.remaining() != 0) {
    throw in.error(std::to_string(in.remaining()) +
                   " bytes of trailing garbage after the last field");
  }
  const uLong computed = in.crc();
  if (in.trailer() != computed) throw in.error("CRC mismatch (file corrupt)");
  return ckpt;
}

// --- Runs and their folder -------------------------------------------------

namespace {

// The pid of a checkpoint's temporary file: named by common::OutputFile
// .ckpt-<step>.vtc.tmp.<pid>.<n>, or by vtrain before it .ckpt-<step>.tmp.<pid>;
// nullopt for any other name.
std::optional<pid_t> temporary_pid(const std::string& name) {
  static const std::regex kTemporary(R"(\.ckpt-[0-9]{1,10}(\.vtc)?\.tmp\.([0-9]{1,9})(\.[0-9]+)?)");
  std::smatch match;
  if (!std::regex_match(name, match, kTemporary)) return std::nullopt;
  return static_cast<pid_t>(std::stol(match[2].str()));
}

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// Removes the temporaries in `dir` that no writer is working on: every one
// when `locked` (the folder's lock keeps other writers out), else those of
// processes gone from this machine. Returns a note per file removed.
std::vector<std::string> remove_stale_temporaries(const std::string& dir, bool locked) {
  std::vector<std::string> notes;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<pid_t> pid = temporary_pid(it->path().filename().string());
    if (!pid || (!locked && process_alive(*pid))) continue;
    std::error_code removed;
    fs::remove(it->path(), removed);
    notes.push_back(removed ? "checkpoint: cannot remove " + it->path().string() +
                                  ", left by a write that did not finish: " + removed.message()
                            : "checkpoint: removed " + it->path().string() +
                                  ", left by a write that did not finish");
  }
  if (ec) throw CheckpointError(dir + ": cannot list checkpoint directory: " + ec.message());
  return notes;
}

// Records this process as the lock's holder, for the message of the next
// process that finds the folder locked (best effort: the lock is what counts).
void write_holder(int fd) {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::string text = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(fd, 0) == 0) {
    (void)common::write_all(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size());
  }
}

std::string read_holder(const std::string& lock) {
  std::string text;
  std::getline(std::ifstream(lock), text);
  return text.empty() ? "another process" : text;
}

// "run 0123abcd", or what is known of a file without a readable run id.
std::string run_name(const std::optional<std::string>& id) {
  if (!id) return "a run whose file cannot be read";
  if (id->empty()) return "a run of an older vtrain, which did not record run ids";
  return "run " + *id;
}

// Refuses to resume when `listed` holds checkpoints of two or more run ids:
// which one --resume should continue cannot be told.
void check_one_run(const std::string& dir, const std::vector<ListedCheckpoint>& listed) {
  std::map<std::string, std::vector<int64_t>> runs;  // run id -> steps
  for (const ListedCheckpoint& c : listed) {
    const std::optional<std::string> id = stored_run_id(c.path.string());
    if (id && !id->empty()) runs[*id].push_back(c.step);
  }
  if (runs.size() < 2) return;
  std::string list;
  for (const auto& [id, steps] : runs) {
    list += (list.empty() ? "" : "; ") + std::string("run ") + id +
            (steps.size() == 1 ? ": step" : ": steps");
    for (size_t i = 0; i < steps.size(); ++i) list += (i ? ", " : " ") + std::to_string(steps[i]);
  }
  throw CheckpointError("checkpoint.dir " + dir + " holds the checkpoints of " +
                        std::to_string(runs.size()) +
                        " runs (" + list + "), and which one to continue cannot be told: move "
                        "the other runs' ckpt-*.vtc files to folders of their own, then resume");
}

}  // namespace

std::string new_run_id() {
  std::random_device source;
  const uint64_t id = (uint64_t{source()} << 32) ^ source();
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(id));
  return text;
}

CheckpointFolder::CheckpointFolder(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError(dir + ": cannot create checkpoint directory: " + ec.message());
  const std::string lock = (fs::path(dir) / ".lock").string();
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) fail(lock, "cannot open the checkpoint folder's lock file", errno);
  try {
    bool locked = true;
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        throw CheckpointError("checkpoint.dir " + dir + " is in use by another vtrain run (" +
                              read_holder(lock) + " holds " + lock + "); wait for it to end, "
                              "or give this run another checkpoint.dir");
      }
      if (err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS) fail(lock, "cannot lock", err);
      locked = false;
      notes_.push_back("checkpoint: " + dir + " cannot be locked (" + errno_text(err) +
                       "): a second vtrain started in this folder meanwhile would not be stopped");
    }
    if (locked) write_holder(lock_fd_);
    for (std::string& note : remove_stale_temporaries(dir, locked)) notes_.push_back(std::move(note));
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
}

CheckpointFolder::~CheckpointFolder() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // drops the lock
}

RunStart plan_run_start(const std::string& dir, ResumeSetting mode) {
  const auto listed = list_checkpoints(dir);
  const bool none = !listed || listed->empty();
  if (mode == ResumeSetting::kNever) {
    if (none) return {};
    const ListedCheckpoint& newest = listed->back();
    throw CheckpointError(
        "checkpoint.dir " + dir + " already holds checkpoints (the newest " +
        newest.path.filename().string() + ", step " + std::to_string(newest.step) + ", of " +
        run_name(stored_run_id(newest.path.string())) + "); a run started afresh there would "
        "mix its checkpoints with them. Continue that run with --resume (or checkpoint.resume: "
        "auto), or give this run a new checkpoint.dir");
  }
  if (none) {
    if (mode == ResumeSetting::kRequired) {
      throw CheckpointError("nothing to resume: checkpoint.dir " + dir + " holds no "
                            "checkpoint (ckpt-*.vtc). Start afresh without --resume (or with "
                            "checkpoint.resume: auto), or point checkpoint.dir at the folder of "
                            "the run to continue");
    }
    return {.resume_from = "",
            .note = "checkpoint.resume auto: " + dir + " holds no checkpoint; starting afresh"};
  }
  check_one_run(dir, *listed);
  return {.resume_from = listed->back().path.string(), .note = ""};
}

}  // namespace vtrain::worker
