// Checkpoint files: the on-disk format, atomic saves and pruning, picking the
// latest, and validation of torn, corrupt and foreign files. Each test works in
// a fresh temporary directory.
#include "common/files.h"
#include "tests/test_support.h"
#include "worker/train/checkpoint.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <zlib.h>

#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace vtrain::worker {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

using test_support::TempDir;

std::string checkpoint_error(const std::function<void()>& fn) {
  return test_support::error_message<CheckpointError>(fn);
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void put_le(Bytes& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

void store_le(Bytes& out, size_t offset, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}

// Rewrites the CRC trailer to match the rest, so a test can reach the checks
// that come after it.
void fix_crc(Bytes& file) {
  const size_t body = file.size() - 4;
  store_le(file, body, crc32_z(0, file.data(), body), 4);
}

std::vector<uint32_t> bits(const std::vector<float>& values) {
  std::vector<uint32_t> out;
  for (float v : values) out.push_back(std::bit_cast<uint32_t>(v));
  return out;
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

Checkpoint small_checkpoint(int64_t step = 7) {
  Checkpoint c;
  c.model_signature = "lenet:abc";
  c.step = step;
  c.epoch = 2;
  c.step_in_epoch = 3;
  c.seed = 42;
  c.world_size = 2;
  c.global_batch = 64;
  c.epoch_sample = 3 * 64;
  c.split = {16, 48};
  c.parameters = {1.0f, -2.5f, 0.125f};
  c.buffers = {0.5f, 4.0f};
  c.velocity = {0.0f, -0.0f, 3.0f};
  c.loss_scaler = LossScalerState{.scale = 0x1p12, .clean_steps = 5, .skipped_steps = 9};
  c.second_moment = {0.25f, 1e-8f, 4.0f};
  c.optimizer_updates = 6;
  c.weight_average = {1.5f, -2.0f, 0.0f};
  c.run_id = "r1";
  c.settings = {{"optimizer.lr", "0.05"}};
  return c;
}

// Byte offsets of small_checkpoint()'s fields in its file.
struct SmallLayout {
  static constexpr size_t kRunIdLength = 12;
  static constexpr size_t kSettingsCount = kRunIdLength + 8 + 2;
  static constexpr size_t kKeyLength = kSettingsCount + 8;
  static constexpr size_t kValueLength = kKeyLength + 8 + 12;
  static constexpr size_t kSignatureLength = kValueLength + 8 + 4;
  static constexpr size_t kSplitCount = kSignatureLength + 8 + 9 + 7 * 8;
  static constexpr size_t kParameterCount = kSplitCount + 8 + 2 * 8;
  static constexpr size_t kBufferCount = kParameterCount + 8 + 3 * 4;
  static constexpr size_t kVelocityCount = kBufferCount + 8 + 2 * 4;
  static constexpr size_t kLossScalerFlag = kVelocityCount + 8 + 3 * 4;
  static constexpr size_t kSecondMomentCount = kLossScalerFlag + 4 + 3 * 8;
  static constexpr size_t kOptimizerUpdates = kSecondMomentCount + 8 + 3 * 4;
  static constexpr size_t kWeightAverageCount = kOptimizerUpdates + 8;
  static constexpr size_t kSize = kWeightAverageCount + 8 + 3 * 4 + 4;
};

// small_checkpoint()'s file as an older vtrain wrote it: version 4 without
// the second moment, the update count and the weight average, version 3
// also without the run's identity, version 2 also without the loss scaler.
Bytes older_version(Bytes file, uint32_t version) {
  if (version < 5) file.erase(file.begin() + SmallLayout::kSecondMomentCount, file.end() - 4);
  if (version < 3) file.erase(file.begin() + SmallLayout::kLossScalerFlag, file.end() - 4);
  if (version < 4) {
    file.erase(file.begin() + SmallLayout::kRunIdLength,
               file.begin() + SmallLayout::kSignatureLength);
  }
  store_le(file, 8, version, 4);
  fix_crc(file);
  return file;
}

TEST(Checkpoint, RoundTripIsBitExact) {
  const TempDir dir;
  Checkpoint c;
  c.model_signature = "resnet18:0123456789abcdef";
  c.step = 123;
  c.epoch = (int64_t{1} << 40) + 3;
  c.step_in_epoch = -5;  // not meaningful, but every bit of an i64 must survive
  c.seed = 0xFEDCBA9876543210ULL;
  c.world_size = 8;
  c.global_batch = std::numeric_limits<int64_t>::min();
  c.epoch_sample = std::numeric_limits<int64_t>::max();
  c.split = {-1, 0, std::numeric_limits<int64_t>::min()};
  for (uint32_t pattern : {0x7FC00001u, 0x7F800001u, 0xFFC12345u, 0x80000000u, 0x00000001u,
                           0x7F800000u, 0xFF800000u, 0x7F7FFFFFu}) {
    c.parameters.push_back(std::bit_cast<float>(pattern));
  }
  // More than one 1 MiB I/O chunk, so chunk boundaries are crossed.
  for (uint32_t i = 0; i < 300'000; ++i) c.buffers.push_back(std::bit_cast<float>(i * 2654435761u));
  c.velocity = {-0.0f, 1e-30f};
  c.second_moment = {std::bit_cast<float>(0x7FC00001u), 0.0f};
  c.optimizer_updates = std::numeric_limits<int64_t>::min();
  c.weight_average = {-0.0f, std::bit_cast<float>(0x00000001u)};
  c.loss_scaler = LossScalerState{.scale = 0x1p-24, .clean_steps = -1,
                                  .skipped_steps = std::numeric_limits<int64_t>::max()};

  const std::string path = save_checkpoint(dir.path("run"), c, 3);
  EXPECT_EQ(path, dir.path("run/ckpt-0000000123.vtc"));
  const Checkpoint back = load_checkpoint(path);
  EXPECT_EQ(back.model_signature, c.model_signature);
  EXPECT_EQ(back.step, c.step);
  EXPECT_EQ(back.epoch, c.epoch);
  EXPECT_EQ(back.step_in_epoch, c.step_in_epoch);
  EXPECT_EQ(back.seed, c.seed);
  EXPECT_EQ(back.world_size, c.world_size);
  EXPECT_EQ(back.global_batch, c.global_batch);
  EXPECT_EQ(back.epoch_sample, c.epoch_sample);
  EXPECT_EQ(back.split, c.split);
  EXPECT_EQ(bits(back.parameters), bits(c.parameters));
  EXPECT_EQ(bits(back.buffers), bits(c.buffers));
  EXPECT_EQ(bits(back.velocity), bits(c.velocity));
  EXPECT_EQ(bits(back.second_moment), bits(c.second_moment));
  EXPECT_EQ(back.optimizer_updates, c.optimizer_updates);
  EXPECT_EQ(bits(back.weight_average), bits(c.weight_average));
  EXPECT_EQ(back.loss_scaler, c.loss_scaler);
  EXPECT_EQ(back.run_id, "");
  EXPECT_TRUE(back.settings.empty());
  c.run_id = "0123456789abcdef";
  c.settings = {{"optimizer.lr", "0.05"}, {"model.layers", "[{name: x}]"}, {"", ""}};
  const Checkpoint identified = load_checkpoint(save_checkpoint(dir.path("id"), c, 1));
  EXPECT_EQ(identified.run_id, c.run_id);
  EXPECT_EQ(identified.settings, c.settings);
  c.loss_scaler.reset();  // a run without loss scaling
  EXPECT_EQ(load_checkpoint(save_checkpoint(dir.path("off"), c, 1)).loss_scaler, std::nullopt);
}

TEST(Checkpoint, FileIsTheDocumentedLittleEndianLayout) {
  const TempDir dir;
  Checkpoint c;
  c.model_signature = "ab";
  c.step = 0x0102030405;
  c.epoch = -1;
  c.seed = 0x1122334455667788ULL;
  c.epoch_sample = 0x0A0B0C;
  c.split = {5, -6};
  c.parameters = {1.0f};
  c.velocity = {-2.0f};
  c.loss_scaler = LossScalerState{.scale = 1024, .clean_steps = 3, .skipped_steps = 4};
  c.second_moment = {0.5f};
  c.optimizer_updates = 0x0708;
  c.run_id = "id";
  c.settings = {{"k", "vw"}};

  Bytes expected = {'V', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
  put_le(expected, 5, 4);
  put_le(expected, 2, 8);  // run_id
  expected.push_back('i');
  expected.push_back('d');
  put_le(expected, 1, 8);  // settings: one key and value
  put_le(expected, 1, 8);
  expected.push_back('k');
  put_le(expected, 2, 8);
  expected.push_back('v');
  expected.push_back('w');
  put_le(expected, 2, 8);
  expected.push_back('a');
  expected.push_back('b');
  for (int64_t v : {c.step, c.epoch, c.step_in_epoch}) {
    put_le(expected, static_cast<uint64_t>(v), 8);
  }
  put_le(expected, c.seed, 8);
  for (int64_t v : {c.world_size, c.global_batch, c.epoch_sample, int64_t{2}, c.split[0],
                    c.split[1]}) {
    put_le(expected, static_cast<uint64_t>(v), 8);
  }
  put_le(expected, 1, 8);
  put_le(expected, 0x3F800000, 4);
  put_le(expected, 0, 8);
  put_le(expected, 1, 8);
  put_le(expected, 0xC0000000, 4);
  put_le(expected, 1, 4);                   // loss_scaler present
  put_le(expected, 0x4090000000000000, 8);  // 1024.0 as a double
  put_le(expected, 3, 8);
  put_le(expected, 4, 8);
  put_le(expected, 1, 8);  // second_moment {0.5}
  put_le(expected, 0x3F000000, 4);
  put_le(expected, 0x0708, 8);  // optimizer_updates
  put_le(expected, 0, 8);       // no weight_average
  put_le(expected, crc32_z(0, expected.data(), expected.size()), 4);

  EXPECT_EQ(read_bytes(save_checkpoint(dir.path(), c, 1)), expected);
}

TEST(Checkpoint, KeepRemovesTheOldest) {
  const TempDir dir;
  write_bytes(dir.path("notes.txt"), {'h', 'i'});
  save_checkpoint(dir.path(), small_checkpoint(1), 2);
  save_checkpoint(dir.path(), small_checkpoint(2), 2);
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"ckpt-0000000001.vtc",
                                                         "ckpt-0000000002.vtc", "notes.txt"}));
  save_checkpoint(dir.path(), small_checkpoint(3), 2);
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"ckpt-0000000002.vtc",
                                                         "ckpt-0000000003.vtc", "notes.txt"}));
}

TEST(Checkpoint, TheFileJustWrittenSurvivesPruning) {
  const TempDir dir;
  save_checkpoint(dir.path(), small_checkpoint(100), 1);
  const std::string written = save_checkpoint(dir.path(), small_checkpoint(50), 1);
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"ckpt-0000000050.vtc"});
  EXPECT_EQ(load_checkpoint(written).step, 50);
}

TEST(Checkpoint, SavingAStepAgainReplacesIt) {
  const TempDir dir;
  Checkpoint c = small_checkpoint(7);
  save_checkpoint(dir.path(), c, 2);
  c.epoch = 9;
  const std::string path = save_checkpoint(dir.path(), c, 2);
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"ckpt-0000000007.vtc"});
  EXPECT_EQ(load_checkpoint(path).epoch, 9);
}

TEST(Checkpoint, LatestIsTheHighestStepAndIgnoresOtherFiles) {
  const TempDir dir;
  EXPECT_EQ(latest_checkpoint(dir.path("missing")), std::nullopt);
  EXPECT_EQ(latest_checkpoint(dir.path()), std::nullopt);
  for (int64_t step : {5, 40, 12}) save_checkpoint(dir.path(), small_checkpoint(step), 10);
  write_bytes(dir.path(".ckpt-0000000099.vtc.tmp.123.0"), {1});  // a save's temporary
  write_bytes(dir.path("notes.txt"), {1});
  write_bytes(dir.path("ckpt-99.vtc"), {1});               // not 10 digits
  write_bytes(dir.path("ckpt-0000000099.vtc.bak"), {1});   // not the full name
  write_bytes(dir.path("ckpt-00000000x9.vtc"), {1});       // not all digits
  EXPECT_EQ(latest_checkpoint(dir.path()), dir.path("ckpt-0000000040.vtc"));
}

TEST(Checkpoint, LatestReportsADirectoryItCannotList) {
  const TempDir dir;
  write_bytes(dir.path("file"), {1});
  EXPECT_CONTAINS(checkpoint_error([&] { latest_checkpoint(dir.path("file")); }), dir.path("file"));
}

TEST(Checkpoint, EveryTruncationIsReported) {
  const TempDir dir;
  const Bytes file = read_bytes(save_checkpoint(dir.path(), small_checkpoint(), 1));
  ASSERT_EQ(file.size(), SmallLayout::kSize);
  const std::string path = dir.path("cut.vtc");
  for (size_t length = 0; length < file.size(); ++length) {
    SCOPED_TRACE("truncated to " + std::to_string(length) + " bytes");
    write_bytes(path, Bytes(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(length)));
    EXPECT_CONTAINS(checkpoint_error([&] { load_checkpoint(path); }), path);
  }
}

TEST(Checkpoint, EveryFlippedByteIsReported) {
  const TempDir dir;
  const Bytes file = read_bytes(save_checkpoint(dir.path(), small_checkpoint(), 1));
  ASSERT_EQ(file.size(), SmallLayout::kSize);
  // Bytes that steer the parse (magic, version, lengths) may give a
  // structural error; every other byte is covered by the CRC alone.
  const auto structural = [](size_t offset) {
    const auto in = [&](size_t start, size_t size) {
      return offset >= start && offset < start + size;
    };
    return in(0, 12) || in(SmallLayout::kRunIdLength, 8) || in(SmallLayout::kSettingsCount, 8) ||
           in(SmallLayout::kKeyLength, 8) || in(SmallLayout::kValueLength, 8) ||
           in(SmallLayout::kSignatureLength, 8) ||
           in(SmallLayout::kSplitCount, 8) || in(SmallLayout::kParameterCount, 8) || in(SmallLayout::kBufferCount, 8) ||
           in(SmallLayout::kVelocityCount, 8) || in(SmallLayout::kLossScalerFlag, 4) ||
           in(SmallLayout::kSecondMomentCount, 8) || in(SmallLayout::kWeightAverageCount, 8);
  };
  const std::string path = dir.path("flipped.vtc");
  for (size_t offset = 0; offset < file.size(); ++offset) {
    SCOPED_TRACE("byte " + std::to_string(offset) + " flipped");
    Bytes corrupt = file;
    corrupt[offset] ^= 0xFF;
    write_bytes(path, corrupt);
    const std::string message = checkpoint_error([&] { load_checkpoint(path); });
    EXPECT_CONTAINS(message, path);
    if (!structural(offset)) {
      EXPECT_CONTAINS(message, "CRC mismatch (file corrupt)");
    }
  }
}

TEST(Checkpoint, WrongMagicIsNotACheckpoint) {
  const TempDir dir;
  const std::string path = dir.path("other.vtc");
  write_bytes(path, Bytes(64, 'x'));
  EXPECT_EQ(checkpoint_error([&] { load_checkpoint(path); }),
            path + ": not a vtrain checkpoint (bad magic)");
}

TEST(Checkpoint, NewerVersionIsRefused) {
  const TempDir dir;
  const std::string path = save_checkpoint(dir.path(), small_checkpoint(), 1);
  Bytes file = read_bytes(path);
  store_le(file, 8, 9, 4);
  fix_crc(file);
  write_bytes(path, file);
  EXPECT_EQ(checkpoint_error([&] { load_checkpoint(path); }),
            path + ": version 9 is newer than this vtrain's 5");
}

// A version 1 file (written before the global sample position and the split
// were stored) loads, with the position computed from the step in the epoch.
TEST(Checkpoint, VersionOneIsStillRead) {
  const TempDir dir;
  Bytes v1 = {'V', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
  put_le(v1, 1, 4);
  put_le(v1, 2, 8);
  v1.push_back('a');
  v1.push_back('b');
  for (int64_t v : {9, 1, 4}) put_le(v1, static_cast<uint64_t>(v), 8);  // step, epoch, in epoch
  put_le(v1, 42, 8);                                                 // seed
  for (int64_t v : {3, 48}) put_le(v1, static_cast<uint64_t>(v), 8);  // world size, batch
  put_le(v1, 1, 8);
  put_le(v1, 0x3F800000, 4);  // parameters {1}
  put_le(v1, 0, 8);           // no buffers
  put_le(v1, 1, 8);
  put_le(v1, 0xC0000000, 4);  // velocity {-2}
  put_le(v1, crc32_z(0, v1.data(), v1.size()), 4);
  const std::string path = dir.path("ckpt-0000000009.vtc");
  write_bytes(path, v1);

  const Checkpoint c = load_checkpoint(path);
  EXPECT_EQ(c.model_signature, "ab");
  EXPECT_EQ(c.step, 9);
  EXPECT_EQ(c.epoch, 1);
  EXPECT_EQ(c.step_in_epoch, 4);
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.world_size, 3);
  EXPECT_EQ(c.global_batch, 48);
  EXPECT_EQ(c.epoch_sample, 4 * 48);
  EXPECT_TRUE(c.split.empty());
  EXPECT_EQ(c.parameters, std::vector<float>{1.0f});
  EXPECT_TRUE(c.buffers.empty());
  EXPECT_EQ(c.velocity, std::vector<float>{-2.0f});
  EXPECT_NO_THROW(check_checkpoint_resumable(c, path, 48, 42));
  EXPECT_EQ(c.loss_scaler, std::nullopt);
  EXPECT_EQ(c.run_id, "");
  EXPECT_EQ(c.optimizer_updates, 9);  // SGD's: one update a step
  // Saved again, it is a version 5 file.
  EXPECT_EQ(read_bytes(save_checkpoint(dir.path("again"), c, 1))[8], 5);
}

// A version 4 file (an SGD run's, before the optimizers' other state and
// train.ema) loads with no second moment or weight average, and one
// update per step.
TEST(Checkpoint, VersionFourIsStillReadWithoutTheNewOptimizerState) {
  const TempDir dir;
  const std::string path = dir.path("ckpt-0000000007.vtc");
  write_bytes(path, older_version(read_bytes(save_checkpoint(dir.path("v5"), small_checkpoint(), 1)), 4));
  const Checkpoint c = load_checkpoint(path);
  EXPECT_EQ(c.run_id, "r1");
  EXPECT_EQ(c.settings, small_checkpoint().settings);
  EXPECT_EQ(c.loss_scaler, small_checkpoint().loss_scaler);
  EXPECT_EQ(c.velocity, small_checkpoint().velocity);
  EXPECT_TRUE(c.second_moment.empty());
  EXPECT_EQ(c.optimizer_updates, 7);
  EXPECT_TRUE(c.weight_average.empty());
}

// A version 2 file is a version 3 one without the loss_scaler field: it
// loads with no loss scale (a resumed run then starts at the initial one).
TEST(Checkpoint, VersionTwoIsStillReadWithoutALossScale) {
  const TempDir dir;
  const std::string path = dir.path("v2.vtc");
  write_bytes(path, older_version(read_bytes(save_checkpoint(dir.path(), small_checkpoint(), 1)), 2));
  const Checkpoint c = load_checkpoint(path);
  EXPECT_EQ(c.loss_scaler, std::nullopt);
  EXPECT_EQ(c.velocity, small_checkpoint().velocity);
  EXPECT_EQ(c.split, small_checkpoint().split);
}

TEST(Checkpoint, LossScalerFlagMustBeZeroOrOne) {
  const TempDir dir;
  const std::string path = save_checkpoint(dir.path(), small_checkpoint(), 1);
  Bytes file = read_bytes(path);
  store_le(file, SmallLayout::kLossScalerFlag, 2, 4);
  fix_crc(file);
  write_bytes(path, file);
  EXPECT_EQ(checkpoint_error([&] { load_checkpoint(path); }),
            path + ": field loss_scaler: flag must be 0 or 1, got 2");
}

TEST(Checkpoint, CorruptLengthIsCheckedBeforeAllocating) {
  const TempDir dir;
  const std::string path = save_checkpoint(dir.path(), small_checkpoint(), 1);
  Bytes file = read_bytes(path);
  store_le(file, SmallLayout::kParameterCount, uint64_t{1} << 61, 8);
  fix_crc(file);
  write_bytes(path, file);
  const size_t left = SmallLayout::kSize - 4 - (SmallLayout::kParameterCount + 8);
  EXPECT_EQ(checkpoint_error([&] { load_checkpoint(path); }),
            path + ": truncated: field parameters declares 2305843009213693952 floats but only " +
                std::to_string(left) + " bytes remain");
}

TEST(Checkpoint, TrailingGarbageIsRefused) {
  const TempDir dir;
  const std::string path = save_checkpoint(dir.path(), small_checkpoint(), 1);
  Bytes file = read_bytes(path);
  file.insert(file.end(), {0, 0, 0, 0, 0});
  write_bytes(path, file);
  EXPECT_EQ(checkpoint_error([&] { load_checkpoint(path); }),
            path + ": 5 bytes of trailing garbage after the last field");
}

TEST(Checkpoint, MissingFileIsReported) {
  const TempDir dir;
  const std::string path = dir.path("ckpt-0000000001.vtc");
  EXPECT_EQ(checkpoint_error([&] { load_checkpoint(path); }),
            path + ": cannot open: No such file or directory");
}

TEST(Checkpoint, MatchChecksNameWhatDiffers) {
  const Checkpoint c = small_checkpoint();
  const std::string path = "run/ckpt-0000000007.vtc";
  EXPECT_NO_THROW(check_checkpoint_matches(c, path, "lenet:abc", 3, 2));
  EXPECT_EQ(checkpoint_error([&] { check_checkpoint_matches(c, path, "vgg:def", 3, 2); }),
            path + " was written for another model (signature lenet:abc, this model vgg:def)");
  EXPECT_EQ(checkpoint_error([&] { check_checkpoint_matches(c, path, "lenet:abc", 4, 2); }),
            path + " holds 3 parameter values, this model has 4");
  EXPECT_EQ(checkpoint_error([&] { check_checkpoint_matches(c, path, "lenet:abc", 3, 1); }),
            path + " holds 2 buffer values, this model has 1");
  Checkpoint short_velocity = c;
  short_velocity.velocity.pop_back();
  EXPECT_EQ(checkpoint_error(
                [&] { check_checkpoint_matches(short_velocity, path, "lenet:abc", 3, 2); }),
            path + " holds 2 velocity values, this model has 3");
  Checkpoint short_moment = c;
  short_moment.second_moment.pop_back();
  EXPECT_EQ(checkpoint_error(
                [&] { check_checkpoint_matches(short_moment, path, "lenet:abc", 3, 2); }),
            path + " holds 2 second moment values, this model has 3");
  Checkpoint long_average = c;
  long_average.weight_average.push_back(1.0f);
  EXPECT_EQ(checkpoint_error(
                [&] { check_checkpoint_matches(long_average, path, "lenet:abc", 3, 2); }),
            path + " holds 4 weight average values, this model has 3");
  Checkpoint sgd = c;  // without either: a run of SGD without train.ema
  sgd.second_moment.clear();
  sgd.weight_average.clear();
  EXPECT_NO_THROW(check_checkpoint_matches(sgd, path, "lenet:abc", 3, 2));
}

TEST(Checkpoint, BadArgumentsWriteNothing) {
  const TempDir dir;
  EXPECT_THROW(save_checkpoint(dir.path("a"), small_checkpoint(), 0), std::invalid_argument);
  EXPECT_THROW(save_checkpoint(dir.path("b"), small_checkpoint(-1), 1), std::invalid_argument);
  EXPECT_THROW(save_checkpoint(dir.path("c"), small_checkpoint(10'000'000'000), 1),
               std::invalid_argument);
  EXPECT_TRUE(names_in(dir.path()).empty());
}

// A directory below a regular file cannot be created, even by root (for whom
// permission bits would not stop anything).
TEST(Checkpoint, UnwritableDirectoryIsReported) {
  const TempDir dir;
  write_bytes(dir.path("file"), {1});
  const std::string target = dir.path("file/sub");
  EXPECT_CONTAINS(checkpoint_error([&] { save_checkpoint(target, small_checkpoint(), 1); }),
                  target);
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"file"});
}

TEST(Checkpoint, FailedWriteLeavesNoFileBehind) {
  const TempDir dir;
  const std::string previous = save_checkpoint(dir.path(), small_checkpoint(1), 5);
  Checkpoint big = small_checkpoint(2);
  big.parameters.assign(10'000, 1.0f);
  std::string message;
  {
    // The first write is cut short at the limit, the retry of the rest fails.
    const test_support::FileSizeLimit limit(1000);
    message = test_support::error_message<common::OutputError>(
        [&] { save_checkpoint(dir.path(), big, 5); });
  }
  EXPECT_CONTAINS(message, "cannot write checkpoint " + dir.path("ckpt-0000000002.vtc") + ": " +
                               std::strerror(EFBIG));
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"ckpt-0000000001.vtc"});
  EXPECT_EQ(load_checkpoint(previous).step, 1);
}

TEST(Checkpoint, DirectoryAtTheNameIsRefusedLeavingNoTemporary) {
  const TempDir dir;
  fs::create_directories(dir.path("ckpt-0000000007.vtc/x"));
  const std::string message = test_support::error_message<common::OutputError>(
      [&] { save_checkpoint(dir.path(), small_checkpoint(7), 1); });
  EXPECT_CONTAINS(message, dir.path("ckpt-0000000007.vtc") + ": it is a directory");
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"ckpt-0000000007.vtc"});
  EXPECT_TRUE(fs::is_directory(dir.path("ckpt-0000000007.vtc")));
}

// Makes a file undeletable for its lifetime, by root too: the immutable
// attribute (ext4, xfs, btrfs; needs CAP_LINUX_IMMUTABLE). ok() says
// whether it could.
class Immutable {
 public:
  explicit Immutable(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    ok_ = fd_ >= 0 && ::ioctl(fd_, FS_IOC_GETFLAGS, &flags_) == 0 && set(flags_ | FS_IMMUTABLE_FL);
  }
  ~Immutable() {
    if (ok_) set(flags_);
    if (fd_ >= 0) ::close(fd_);
  }
  Immutable(const Immutable&) = delete;
  Immutable& operator=(const Immutable&) = delete;
  bool ok() const { return ok_; }

 private:
  bool set(int flags) { return ::ioctl(fd_, FS_IOC_SETFLAGS, &flags) == 0; }
  int fd_;
  int flags_ = 0;
  bool ok_ = false;
};

TEST(Checkpoint, PruneFailureIsReportedAfterTheNewFileIsSafe) {
  const TempDir dir;
  const std::string old = save_checkpoint(dir.path(), small_checkpoint(1), 1);
  const Immutable stuck(old);
  if (!stuck.ok()) GTEST_SKIP() << "cannot make a file undeletable here (immutable attribute)";
  const std::string message =
      checkpoint_error([&] { save_checkpoint(dir.path(), small_checkpoint(2), 1); });
  EXPECT_CONTAINS(message, dir.path("ckpt-0000000002.vtc") + " was saved");
  EXPECT_CONTAINS(message, old);
  EXPECT_EQ(load_checkpoint(dir.path("ckpt-0000000002.vtc")).step, 2);
}

// small_checkpoint(step) of run `run`.
Checkpoint of_run(const std::string& run, int64_t step) {
  Checkpoint c = small_checkpoint(step);
  c.run_id = run;
  return c;
}

// A file from before version 4 carries no run: it loads as an unknown one.
TEST(Checkpoint, VersionThreeIsReadAsAnUnknownRun) {
  const TempDir dir;
  const std::string path = dir.path("ckpt-0000000007.vtc");
  write_bytes(path, older_version(read_bytes(save_checkpoint(dir.path("v5"), small_checkpoint(), 1)), 3));
  const Checkpoint c = load_checkpoint(path);
  EXPECT_EQ(c.run_id, "");
  EXPECT_TRUE(c.settings.empty());
  EXPECT_EQ(c.loss_scaler, small_checkpoint().loss_scaler);
  EXPECT_EQ(c.parameters, small_checkpoint().parameters);
}

// The folder: run A left 20, 25, 30; run B's pruning (keep 3) must
// keep its own 12 and leave A's alone, then drop its own oldest only.
TEST(Checkpoint, PruningTouchesOnlyTheRunsOwnFiles) {
  const TempDir dir;
  for (int64_t step : {20, 25, 30}) save_checkpoint(dir.path(), of_run("a", step), 3);
  save_checkpoint(dir.path(), of_run("b", 12), 3);
  EXPECT_EQ(names_in(dir.path()),
            (std::set<std::string>{"ckpt-0000000012.vtc", "ckpt-0000000020.vtc",
                                   "ckpt-0000000025.vtc", "ckpt-0000000030.vtc"}));
  for (int64_t step : {14, 16, 18}) save_checkpoint(dir.path(), of_run("b", step), 3);
  EXPECT_EQ(names_in(dir.path()),
            (std::set<std::string>{"ckpt-0000000014.vtc", "ckpt-0000000016.vtc",
                                   "ckpt-0000000018.vtc", "ckpt-0000000020.vtc",
                                   "ckpt-0000000025.vtc", "ckpt-0000000030.vtc"}));
  // A file of an older version (no run) and one that is no checkpoint stay too.
  write_bytes(dir.path("ckpt-0000000001.vtc"),
              older_version(read_bytes(dir.path("ckpt-0000000014.vtc")), 3));
  write_bytes(dir.path("ckpt-0000000002.vtc"), {'x'});
  save_checkpoint(dir.path(), of_run("b", 19), 1);
  EXPECT_EQ(names_in(dir.path()),
            (std::set<std::string>{"ckpt-0000000001.vtc", "ckpt-0000000002.vtc",
                                   "ckpt-0000000019.vtc", "ckpt-0000000020.vtc",
                                   "ckpt-0000000025.vtc", "ckpt-0000000030.vtc"}));
}

TEST(CheckpointRuns, NewRunIdsDiffer) {
  const std::string a = new_run_id(), b = new_run_id();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_NE(a, b);
}

TEST(CheckpointRuns, AFreshStartIsRefusedWhereCheckpointsAre) {
  const TempDir dir;
  EXPECT_EQ(plan_run_start(dir.path("missing"), ResumeSetting::kNever).resume_from, "");
  EXPECT_EQ(plan_run_start(dir.path(), ResumeSetting::kNever).resume_from, "");
  save_checkpoint(dir.path(), of_run("0123abcd", 30), 3);
  const std::string message =
      checkpoint_error([&] { plan_run_start(dir.path(), ResumeSetting::kNever); });
  EXPECT_CONTAINS(message, "checkpoint.dir " + dir.path() + " already holds checkpoints (the "
                           "newest ckpt-0000000030.vtc, step 30, of run 0123abcd)");
  EXPECT_CONTAINS(message, "--resume");
  EXPECT_CONTAINS(message, "a new checkpoint.dir");
}

TEST(CheckpointRuns, ResumeTakesTheNewestAndNeedsOne) {
  const TempDir dir;
  EXPECT_CONTAINS(checkpoint_error([&] { plan_run_start(dir.path(), ResumeSetting::kRequired); }),
                  "nothing to resume: checkpoint.dir " + dir.path() + " holds no checkpoint");
  const RunStart fresh = plan_run_start(dir.path(), ResumeSetting::kAuto);
  EXPECT_EQ(fresh.resume_from, "");
  EXPECT_EQ(fresh.note, "checkpoint.resume auto: " + dir.path() + " holds no checkpoint; starting afresh");
  for (int64_t step : {5, 10}) save_checkpoint(dir.path(), of_run("a", step), 3);
  // A file of an older vtrain (no run id) does not make the folder ambiguous.
  write_bytes(dir.path("ckpt-0000000001.vtc"),
              older_version(read_bytes(dir.path("ckpt-0000000005.vtc")), 3));
  for (ResumeSetting mode : {ResumeSetting::kAuto, ResumeSetting::kRequired}) {
    const RunStart start = plan_run_start(dir.path(), mode);
    EXPECT_EQ(start.resume_from, dir.path("ckpt-0000000010.vtc"));
    EXPECT_EQ(start.note, "");
  }
}

TEST(CheckpointRuns, AFolderOfTwoRunsCannotBeResumed) {
  const TempDir dir;
  for (int64_t step : {20, 25, 30}) save_checkpoint(dir.path(), of_run("a", step), 3);
  save_checkpoint(dir.path(), of_run("b", 12), 3);
  EXPECT_CONTAINS(checkpoint_error([&] { plan_run_start(dir.path(), ResumeSetting::kRequired); }),
                  "checkpoint.dir " + dir.path() + " holds the checkpoints of 2 runs (run a: "
                  "steps 20, 25, 30; run b: step 12)");
}

TEST(CheckpointRuns, SettingsThatDifferAreNamed) {
  Checkpoint c = small_checkpoint();
  c.settings = {{"optimizer.lr", "0.05"}, {"model.preset", "lenet"}, {"data.kind", "synthetic"},
                {"model.layers", std::string(60, 'x')}};
  const std::string path = "run/ckpt-0000000007.vtc";
  EXPECT_NO_THROW(check_checkpoint_settings(c, path, c.settings));
  // Keys only one side has are not compared.
  EXPECT_NO_THROW(check_checkpoint_settings(c, path, {{"optimizer.gamma", "0.1"}}));
  EXPECT_EQ(checkpoint_error([&] {
              check_checkpoint_settings(c, path,
                                        {{"optimizer.lr", "0.01"}, {"model.preset", "lenet"},
                                         {"data.kind", "idx"}, {"model.layers", "y"}});
            }),
            path + " belongs to run r1, which was configured with optimizer.lr 0.05 (this run: "
                   "0.01), data.kind synthetic (this run: idx), model.layers. A run continues "
                   "with the settings it began with: set them back to resume it, or start this "
                   "run afresh in another checkpoint.dir");
  c.settings.clear();  // an older vtrain's file: nothing to compare
  EXPECT_NO_THROW(check_checkpoint_settings(c, path, {{"optimizer.lr", "0.01"}}));
}

// The folder is held by one run at a time; taking it removes the
// temporaries a killed writer left, and nothing else.
TEST(CheckpointRuns, AFolderIsHeldByOneRunAndLosesItsLeftovers) {
  const TempDir dir;
  save_checkpoint(dir.path(), of_run("a", 5), 3);
  write_bytes(dir.path(".ckpt-6.tmp.4000000"), Bytes(100, 1));
  write_bytes(dir.path(".ckpt-7.tmp." + std::to_string(::getpid())), Bytes(100, 1));
  // The name common::OutputFile gives a checkpoint's temporary.
  write_bytes(dir.path(".ckpt-0000000008.vtc.tmp.4000000.0"), Bytes(100, 1));
  write_bytes(dir.path(".ckpt-x.tmp.1"), {1});  // not a name save_checkpoint makes
  write_bytes(dir.path("notes.txt"), {1});
  std::vector<std::string> notes;
  {
    const CheckpointFolder held(dir.path());
    notes = held.notes();
    EXPECT_CONTAINS(checkpoint_error([&] { CheckpointFolder second(dir.path()); }),
                    "checkpoint.dir " + dir.path() + " is in use by another vtrain run (pid " +
                        std::to_string(::getpid()));
  }
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{".ckpt-x.tmp.1", ".lock",
                                                         "ckpt-0000000005.vtc", "notes.txt"}));
  ASSERT_EQ(notes.size(), 3u);
  for (const std::string& note : notes) EXPECT_CONTAINS(note, "left by a write that did not finish");
  // Released with the holder: the next run takes it.
  EXPECT_NO_THROW(CheckpointFolder again(dir.path()));
  // A folder that does not exist yet is made.
  EXPECT_NO_THROW(CheckpointFolder fresh(dir.path("new/sub")));
  EXPECT_TRUE(fs::is_directory(dir.path("new/sub")));
}

}  // namespace
}  // namespace vtrain::worker
