// Helpers shared by the test suites: temporary directories, expected
// exceptions, and running the vtrain executable as users do.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace vtrain::test_support {

// VTRAIN_REQUIRE_GPU=1: this run is on a GPU (a lent machine), so a GPU
// test that finds none fails instead of skipping: a driver the CUDA runtime
// cannot use must not pass as a row of skips.
inline bool gpu_required() {
  const char* v = std::getenv("VTRAIN_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// Leaves a GPU test that cannot run here, saying why: skipped, or failed
// under VTRAIN_REQUIRE_GPU=1.
#define VTRAIN_SKIP_WITHOUT_GPU(why)                                 \
  do {                                                               \
    if (::vtrain::test_support::gpu_required()) {                    \
      FAIL() << "VTRAIN_REQUIRE_GPU=1, but no GPU test can run: " << (why); \
    }                                                                \
    GTEST_SKIP() << (why);                                           \
  } while (0)

#define EXPECT_CONTAINS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "message \"" << (text) << "\" does not contain \"" << (part) << "\""

// A fresh directory under `base` (the system temp dir by default), removed
// with its contents.
class TempDir {
 public:
  explicit TempDir(const std::filesystem::path& base = std::filesystem::temp_directory_path()) {
    std::string pattern = (base / "vtrain_test.XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed in " + base.string());
    }
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path(const std::string& name = "") const { return (path_ / name).string(); }
  // Writes `text` to `name` (sub-folders created); returns the file's path.
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    const std::filesystem::path file = path_ / name;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
    return file;
  }

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

// The repository root: VTRAIN_SOURCE_DIR if set, else the sources this test
// was built from (tests/CMakeLists.txt compiles the path in).
inline std::string source_dir() {
  const char* dir = std::getenv("VTRAIN_SOURCE_DIR");
  return dir && *dir ? dir : VTRAIN_TEST_SOURCE_DIR;
}

// The vtrain executable under test: VTRAIN_BINARY if set, else the one built
// in the same tree as this test, whatever that tree is called.
inline std::string vtrain_binary() {
  const char* bin = std::getenv("VTRAIN_BINARY");
  return bin && *bin ? bin : VTRAIN_TEST_BINARY;
}

// The Python that has Debian's torch/torchvision and PyPI's onnxruntime,
// onnx and safetensors (the venv scripts/setup.sh --test makes), and the
// reason it cannot be used, empty when it can: tests that compare against
// those tools GTEST_SKIP with that reason.
inline std::string test_python() { return VTRAIN_TEST_PYTHON; }
inline std::string test_python_missing(const std::string& modules) {
  const std::string probe = test_python() + " -c 'import " + modules + "' >/dev/null 2>&1";
  if (std::system(probe.c_str()) == 0) return "";
  return test_python() + " cannot import " + modules +
         " (run scripts/setup.sh --test, which makes that venv)";
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

// What running the vtrain under test gave.
struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs the vtrain under test with `args` (shell words), as a user would.
inline RunResult run_vtrain(const std::string& args) {
  RunResult r;
  r.exit_code = run_command(vtrain_binary() + " " + args, &r.output);
  return r;
}

// mpirun as users run it on one machine (scripts/mpirun.sh: root allowed,
// no cross-process copies), with more ranks than cores (a rank waiting in
// MPI yields its core) over shared memory only; prefix a command with it.
// `flags` are more mpirun options.
inline std::string mpirun(int ranks, const std::string& flags = "") {
  return "env OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 " + source_dir() +
         "/scripts/mpirun.sh --oversubscribe " + (flags.empty() ? "" : flags + " ") + "-np " +
         std::to_string(ranks) + " ";
}

// How far two runs' weights (or other float arrays of one size) differ.
struct Difference {
  double max_abs = 0;   // max |a - b|
  double relative = 0;  // max |a - b| / max |a|: relative to the weights' scale
};

inline Difference compare(const std::vector<float>& a, const std::vector<float>& b) {
  Difference d;
  double scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d.max_abs = std::max(d.max_abs, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(a[i])));
  }
  d.relative = scale > 0 ? d.max_abs / scale : d.max_abs;
  return d;
}

// The whole contents of a file; empty when it cannot be read.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Lowers RLIMIT_FSIZE for its lifetime, so writes past `bytes` fail with
// EFBIG, as on a full disk (SIGXFSZ, which would kill the process, is
// ignored meanwhile).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old_);
    rlimit lowered = old_;
    lowered.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lowered);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_DFL;
};

// Makes a character device node at `path` for one of Linux's memory devices
// (minor 3: null, 7: full) and returns `path`; "" with errno set when this
// process may not (not root, a user namespace without CAP_MKNOD). Such a
// node in a temporary folder lets a test write to "a device" without
// risking /dev's.
inline std::string make_char_device(const std::string& path, unsigned minor) {
  return ::mknod(path.c_str(), S_IFCHR | 0666, makedev(1, minor)) == 0 ? path : "";
}

inline bool is_char_device(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

// Starts `command` under /bin/sh -c without waiting for it; its pid, or -1.
inline pid_t spawn_shell(const std::string& command) {
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  return posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) == 0
             ? pid
             : -1;
}

// Polls `done` until it holds or `timeout` has passed; whether it held.
inline bool wait_until(const std::function<bool()>& done, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// Waits up to `timeout` for process `pid` to end: its exit code (-1 when a
// signal ended it), or nullopt when it was still running and was killed.
inline std::optional<int> wait_exit(pid_t pid, std::chrono::seconds timeout) {
  int status = 0;
  if (!wait_until([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return std::nullopt;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace vtrain::test_support
