// Helpers shared by the test suites: temporary directories, expected
// exceptions, and running the vtrain executable as users do.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

namespace vtrain::test_support {

#define EXPECT_CONTAINS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "message \"" << (text) << "\" does not contain \"" << (part) << "\""

// A fresh directory under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "vtrain_test.XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path(const std::string& name = "") const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// The message of the E that `fn` throws; a test failure if it throws nothing
// or something else.
template <typename E>
std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected another exception type, got: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected an exception, nothing was thrown";
  return {};
}

// The repository root (CTest sets VTRAIN_SOURCE_DIR).
inline std::string source_dir() {
  const char* dir = std::getenv("VTRAIN_SOURCE_DIR");
  return dir ? dir
             : std::filesystem::path(__FILE__).parent_path().parent_path().string();
}

// The vtrain executable under test (CTest sets VTRAIN_BINARY).
inline std::string vtrain_binary() {
  const char* bin = std::getenv("VTRAIN_BINARY");
  return bin ? bin : (std::filesystem::path(source_dir()) / "build" / "vtrain").string();
}

// Runs a shell command; returns its exit code (-1 if it did not exit) and
// its stdout and stderr together in *output.
inline int run_command(const std::string& command, std::string* output = nullptr) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::string text;
  char buf[4096];
  while (size_t got = std::fread(buf, 1, sizeof buf, pipe)) text.append(buf, got);
  const int status = pclose(pipe);
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace vtrain::test_support
