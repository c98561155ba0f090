// Output files (common/files.h): a regular file replaced whole, a symbolic
// link followed, a device or FIFO written in place, a directory refused, a
// failure leaving the old file and no temporary; and the metrics file's
// appends (worker/train/metrics.h), which a full disk must not tear.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <string>

#include "common/files.h"
#include "tests/test_support.h"
#include "worker/train/metrics.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using common::OutputError;
using common::write_file_whole;
using test_support::read_file;
using test_support::TempDir;

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

std::string output_error(const std::function<void()>& fn) {
  return test_support::error_message<OutputError>(fn);
}

TEST(OutputFile, ReplacesARegularFileKeepingItsPermissions) {
  const TempDir dir;
  const std::string path = dir.write("plan.yaml", "old").string();
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_file_whole(path, "new", "plan");
  EXPECT_EQ(read_file(path), "new");
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"plan.yaml"});
}

// A chain of links, one relative to its own folder: the file at its end is
// replaced, every link stays a link; a dangling link's target is created.
TEST(OutputFile, FollowsSymbolicLinks) {
  const TempDir dir;
  const std::string target = dir.write("real/plan.yaml", "old").string();
  fs::create_directories(dir.path("links"));
  fs::create_symlink("../real/plan.yaml", dir.path("links/relative"));
  fs::create_symlink(dir.path("links/relative"), dir.path("plan.yaml"));
  write_file_whole(dir.path("plan.yaml"), "new", "plan");
  EXPECT_EQ(read_file(target), "new");
  EXPECT_TRUE(fs::is_symlink(dir.path("plan.yaml")));
  EXPECT_TRUE(fs::is_symlink(dir.path("links/relative")));
  EXPECT_EQ(names_in(dir.path("real")), std::set<std::string>{"plan.yaml"});

  fs::create_symlink("missing.yaml", dir.path("dangling"));
  write_file_whole(dir.path("dangling"), "made", "plan");
  EXPECT_EQ(read_file(dir.path("missing.yaml")), "made");
  EXPECT_TRUE(fs::is_symlink(dir.path("dangling")));
}

TEST(OutputFile, WritesACharacterDeviceInPlace) {
  const TempDir dir;
  const std::string null = test_support::make_char_device(dir.path("null"), 3);
  if (null.empty()) GTEST_SKIP() << "mknod is not permitted here: " << std::strerror(errno);
  write_file_whole(null, "discarded", "plan");
  EXPECT_TRUE(test_support::is_char_device(null)) << null << " was replaced";
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"null"});

  const std::string full = test_support::make_char_device(dir.path("full"), 7);
  EXPECT_EQ(output_error([&] { write_file_whole(full, "text", "plan"); }),
            "cannot write plan " + full + ": " + std::strerror(ENOSPC));
  EXPECT_TRUE(test_support::is_char_device(full)) << full << " was replaced";
}

// The reader opens first (non-blocking), so the writer's open does not wait;
// the text is then in the pipe.
TEST(OutputFile, WritesAFifoInPlace) {
  const TempDir dir;
  const std::string fifo = dir.path("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const common::Fd reader(::open(fifo.c_str(), O_RDONLY | O_NONBLOCK));
  ASSERT_TRUE(reader.valid()) << std::strerror(errno);
  write_file_whole(fifo, "through the pipe", "trace");
  char buf[64] = {};
  const ssize_t got = ::read(reader.get(), buf, sizeof buf);
  EXPECT_EQ(std::string(buf, got > 0 ? static_cast<size_t>(got) : 0), "through the pipe");
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << fifo << " was replaced";
}

TEST(OutputFile, RefusesADirectory) {
  const TempDir dir;
  fs::create_directories(dir.path("adir"));
  EXPECT_EQ(output_error([&] { write_file_whole(dir.path("adir"), "text", "plan"); }),
            "cannot write plan " + dir.path("adir") + ": it is a directory, expected a file name");
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"adir"});
  EXPECT_TRUE(names_in(dir.path("adir")).empty());
}

TEST(OutputFile, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  const TempDir dir;
  const std::string path = dir.write("trace.json", "old").string();
  std::string message;
  {
    const test_support::FileSizeLimit limit(1000);
    message = output_error([&] { write_file_whole(path, std::string(5000, 'x'), "trace"); });
  }
  EXPECT_EQ(message, "cannot write trace " + path + ": " + std::strerror(EFBIG));
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"trace.json"});
}

TEST(OutputFile, NothingAppearsWithoutCommit) {
  const TempDir dir;
  {
    common::OutputFile out(dir.path("plan.yaml"), "plan");
    out.write("half a plan");
  }
  EXPECT_TRUE(names_in(dir.path()).empty());
}

TEST(MetricsFile, AWriteErrorNamesTheReason) {
  const TempDir dir;
  const std::string full = test_support::make_char_device(dir.path("full"), 7);
  const std::string path = full.empty() ? "/dev/full" : full;  // a node of ours if we may make one
  worker::MetricsFile metrics(path);
  EXPECT_EQ(output_error([&] { metrics.write(worker::JsonRecord().add("step", 1)); }),
            "cannot write metrics file " + path + ": " + std::strerror(ENOSPC));
}

// A disk that fills up in the middle of a record: the part that fitted is
// cut off again, so the file ends with the last whole record.
TEST(MetricsFile, AFullDiskLeavesNoTornRecord) {
  const TempDir dir;
  const std::string path = dir.path("metrics.jsonl");
  worker::MetricsFile metrics(path);
  const std::string padding(40, 'p');
  std::string message;
  int written = 0;
  {
    const test_support::FileSizeLimit limit(1000);
    message = output_error([&] {
      for (;; ++written) metrics.write(worker::JsonRecord().add("step", written).add("pad", padding));
    });
  }
  EXPECT_EQ(message, "cannot write metrics file " + path + ": " + std::strerror(EFBIG));
  const std::string text = read_file(path);
  ASSERT_GT(written, 0);
  const std::string last = worker::JsonRecord().add("step", written - 1).add("pad", padding).str();
  EXPECT_TRUE(text.ends_with(last + "\n"))
      << "the file ends with: " << text.substr(text.size() > 80 ? text.size() - 80 : 0);
  EXPECT_EQ(static_cast<int64_t>(std::count(text.begin(), text.end(), '\n')), written);
}

}  // namespace
}  // namespace vtrain
