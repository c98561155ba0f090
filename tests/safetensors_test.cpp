// The safetensors writer and reader (model_io/safetensors.h): a round trip,
// a file the reference library wrote, and every kind of malformed file
// refused with an error that names the file and the tensor.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "model_io/safetensors.h"
#include "tests/test_support.h"

namespace vtrain::model_io {
namespace {

using test_support::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file of `header` (padded to 8 bytes as the format's writer pads it)
// and `data` bytes, as written by hand: what a foreign or broken writer
// could produce.
std::string handmade(const TempDir& dir, const std::string& header, const std::string& data,
                     int64_t length_delta = 0) {
  std::string text = header;
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size() + length_delta;
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &length, 8);
  const std::string path = dir.path("w.safetensors");
  std::ofstream(path, std::ios::binary) << bytes << text << data;
  return path;
}

// The error reading `path` gives ("" when it reads).
std::string read_error(const std::string& path) {
  try {
    SafetensorsFile::read(path);
  } catch (const WeightsError& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripKeepsNamesShapesBytesAndMetadata) {
  const TempDir dir;
  const std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  const std::vector<float> b = {0.5f, -0.5f};
  const int64_t count = 42;
  const std::string path = dir.path("m.safetensors");
  const uint64_t bytes = write_safetensors(
      path,
      {{"fc.weight", Dtype::kF32, {2, 3}, w.data()},
       {"fc.bias", Dtype::kF32, {2}, b.data()},
       {"bn.num_batches_tracked", Dtype::kI64, {}, &count}},
      {{"format", "pt"}});
  const std::string raw = read_bytes(path);
  ASSERT_EQ(raw.size(), bytes);
  uint64_t length = 0;
  std::memcpy(&length, raw.data(), 8);
  EXPECT_EQ((8 + length) % 8, 0u) << "the data starts 8-byte aligned";

  const SafetensorsFile file = SafetensorsFile::read(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  ASSERT_EQ(file.tensors().size(), 3u);
  const TensorEntry* weight = file.find("fc.weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->dtype, Dtype::kF32);
  EXPECT_EQ(weight->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> back(6);
  std::memcpy(back.data(), file.bytes(*weight).data(), 24);
  EXPECT_EQ(back, w);
  const TensorEntry* batches = file.find("bn.num_batches_tracked");
  ASSERT_NE(batches, nullptr);
  EXPECT_EQ(batches->dtype, Dtype::kI64);
  EXPECT_TRUE(batches->shape.empty());
  int64_t n = 0;
  std::memcpy(&n, file.bytes(*batches).data(), 8);
  EXPECT_EQ(n, 42);
}

// What safetensors.torch writes, vtrain reads, and the reverse.
TEST(Safetensors, TheReferenceLibraryReadsAndWritesTheSameFormat) {
  const std::string missing = test_support::test_python_missing("torch, safetensors");
  if (!missing.empty()) GTEST_SKIP() << missing;
  const TempDir dir;
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  write_safetensors(dir.path("ours.safetensors"), {{"a.weight", Dtype::kF32, {3, 2}, w.data()}},
                    {{"format", "pt"}});
  const std::string script = dir.write("rt.py", R"(
import sys, torch
from safetensors.torch import load_file, save_file
d = load_file(sys.argv[1] + "/ours.safetensors")
assert d["a.weight"].tolist() == [[1, 2], [3, 4], [5, 6]], d
save_file({"x": torch.arange(12, dtype=torch.float32).reshape(3, 4),
           "n": torch.tensor(7, dtype=torch.int64)}, sys.argv[1] + "/theirs.safetensors",
          metadata={"format": "pt"})
)").string();
  std::string output;
  ASSERT_EQ(test_support::run_command(test_support::test_python() + " " + script + " " +
                                          dir.path(),
                                      &output),
            0)
      << output;
  const SafetensorsFile theirs = SafetensorsFile::read(dir.path("theirs.safetensors"));
  const TensorEntry* x = theirs.find("x");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->shape, (std::vector<int64_t>{3, 4}));
  std::vector<float> values(12);
  std::memcpy(values.data(), theirs.bytes(*x).data(), 48);
  EXPECT_EQ(values[11], 11.0f);
  ASSERT_NE(theirs.find("n"), nullptr);
  EXPECT_EQ(theirs.find("n")->dtype, Dtype::kI64);
}

TEST(Safetensors, TruncatedFilesAreRefused) {
  const TempDir dir;
  const std::vector<float> w(16, 1.0f);
  const std::string path = dir.path("t.safetensors");
  write_safetensors(path, {{"w", Dtype::kF32, {16}, w.data()}}, {});
  const std::string whole = read_bytes(path);
  // Cut in the length, in the header, and in the data.
  for (size_t keep : {size_t{5}, size_t{12}, whole.size() - 4}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << whole.substr(0, keep);
    const std::string error = read_error(path);
    EXPECT_NE(error.find(path), std::string::npos) << keep << ": " << error;
    if (keep == 5) {
      EXPECT_NE(error.find("truncated"), std::string::npos) << error;
    }
    if (keep == 12) {
      EXPECT_NE(error.find("exceeds"), std::string::npos) << error;
    }
    if (keep == whole.size() - 4) {
      EXPECT_NE(error.find("tensor 'w'"), std::string::npos) << error;
      EXPECT_NE(error.find("run past the data"), std::string::npos) << error;
    }
  }
}

TEST(Safetensors, AHeaderLengthBeyondTheFileIsRefused) {
  const TempDir dir;
  const std::string path =
      handmade(dir, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd", 1000);
  const std::string error = read_error(path);
  EXPECT_NE(error.find(path + ": not a safetensors file, or truncated: its header length"),
            std::string::npos)
      << error;
}

TEST(Safetensors, ForeignFilesAreRefused) {
  const TempDir dir;
  const std::string png = dir.path("x.png");
  std::ofstream(png, std::ios::binary) << std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
  EXPECT_NE(read_error(png).find(png + ": not a safetensors file"), std::string::npos)
      << read_error(png);
  EXPECT_NE(read_error(handmade(dir, "[1, 2]", "")).find("not a safetensors file"),
            std::string::npos);
  EXPECT_NE(read_error(handmade(dir, "{\"w\": ", "")).find("header is not JSON"),
            std::string::npos);
  EXPECT_NE(read_error(dir.path("absent")).find("cannot read"), std::string::npos);
}

TEST(Safetensors, OffsetsOutOfRangeOverlappingOrLeavingGapsAreRefused) {
  const TempDir dir;
  const std::string past = read_error(
      handmade(dir, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd"));
  EXPECT_NE(past.find("tensor 'w': data_offsets [0, 8] run past the data, which holds 4 bytes"),
            std::string::npos)
      << past;
  const std::string backwards = read_error(
      handmade(dir, R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", "abcd"));
  EXPECT_NE(backwards.find("tensor 'w': data_offsets [4, 0] end before they begin"),
            std::string::npos)
      << backwards;
  const std::string overlap = read_error(handmade(
      dir,
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      "abcdefgh"));
  EXPECT_NE(overlap.find("tensor 'b': its data [4, 8) overlaps tensor 'a'"), std::string::npos)
      << overlap;
  const std::string gap = read_error(handmade(
      dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "abcdefgh"));
  EXPECT_NE(gap.find("tensor 'a': its data starts at byte 4, leaving bytes [0, 4)"),
            std::string::npos)
      << gap;
  const std::string trailing = read_error(handmade(
      dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcdefgh"));
  EXPECT_NE(trailing.find("4 bytes after the last tensor's data belong to no tensor"),
            std::string::npos)
      << trailing;
}

TEST(Safetensors, WrongDtypeAndShapeAreRefused) {
  const TempDir dir;
  const std::string dtype = read_error(
      handmade(dir, R"({"w":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", "abcd"));
  EXPECT_NE(dtype.find("tensor 'w': unknown dtype \"F31\" (known: F64, F32,"), std::string::npos)
      << dtype;
  const std::string shape = read_error(
      handmade(dir, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "abcdefgh"));
  EXPECT_NE(shape.find("tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] "
                       "hold 8"),
            std::string::npos)
      << shape;
  const std::string negative = read_error(
      handmade(dir, R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"));
  EXPECT_NE(negative.find("tensor 'w': shape holds -1, expected integers >= 0"),
            std::string::npos)
      << negative;
  const std::string huge = read_error(handmade(
      dir, R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
      "abcd"));
  EXPECT_NE(huge.find("tensor 'w': shape [4294967296, 4294967296] is too large"),
            std::string::npos)
      << huge;
  const std::string key = read_error(handmade(
      dir, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", "abcd"));
  EXPECT_NE(key.find("tensor 'w': unknown key 'extra'"), std::string::npos) << key;
  const std::string no_shape =
      read_error(handmade(dir, R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"));
  EXPECT_NE(no_shape.find("tensor 'w': no shape"), std::string::npos) << no_shape;
}

TEST(Safetensors, ANameGivenTwiceAndBadMetadataAreRefused) {
  const TempDir dir;
  const std::string twice = read_error(handmade(
      dir,
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      "abcdefgh"));
  EXPECT_NE(twice.find("the header names 'w' twice"), std::string::npos) << twice;
  const std::string metadata = read_error(handmade(
      dir,
      R"({"__metadata__":{"format":1},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      "abcd"));
  EXPECT_NE(metadata.find("__metadata__: 'format' is not a string"), std::string::npos)
      << metadata;
}

TEST(Safetensors, TheWriterRefusesDuplicateAndReservedNames) {
  const TempDir dir;
  const float v = 1;
  EXPECT_THROW(write_safetensors(dir.path("d"), {{"a", Dtype::kF32, {1}, &v},
                                                 {"a", Dtype::kF32, {1}, &v}}, {}),
               std::invalid_argument);
  EXPECT_THROW(write_safetensors(dir.path("d"), {{"__metadata__", Dtype::kF32, {1}, &v}}, {}),
               std::invalid_argument);
}

}  // namespace
}  // namespace vtrain::model_io
