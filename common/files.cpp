#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace vtrain::common {
namespace {

namespace fs = std::filesystem;

// As many links as Linux follows in one path before ELOOP.
constexpr int kMaxLinks = 40;
// Temporary names tried before giving up (each one taken by another writer).
constexpr int kTemporaryAttempts = 100;

[[noreturn]] void fail_output(const std::string& what, const std::string& path,
                              const std::string& reason) {
  throw OutputError("cannot write " + what + " " + path + ": " + reason);
}

// The file a write to `path` reaches: `path` with the symbolic links at its
// end followed (a relative target from its link's folder). It may not exist
// yet (a dangling link): the write creates it. Errors other than "too many
// links" are left to the open() that follows, which names them.
fs::path final_target(const std::string& what, const std::string& path) {
  fs::path at = path;
  for (int links = 0; links <= kMaxLinks; ++links) {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return at;
    std::error_code error;
    const fs::path target = fs::read_symlink(at, error);
    if (error) fail_output(what, path, "cannot read the link " + at.string() + ": " + error.message());
    at = target.is_absolute() ? target : at.parent_path() / target;
  }
  fail_output(what, path, std::strerror(ELOOP));
}

// The folder holding `file`, for open(): "." for a bare name.
fs::path folder_of(const fs::path& file) {
  return file.has_parent_path() ? file.parent_path() : fs::path(".");
}

}  // namespace

int Fd::close() {
  const int fd = std::exchange(fd_, -1);
  return ::close(fd) == 0 ? 0 : errno;
}

int write_all(int fd, const void* data, size_t n) {
  const char* next = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t written = ::write(fd, next, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    // write() of a non-zero count returning 0 would loop forever; a regular
    // file only does it when it cannot grow.
    if (written == 0) return ENOSPC;
    next += written;
    n -= static_cast<size_t>(written);
  }
  return 0;
}

OutputFile::OutputFile(std::string path, std::string what, Sync sync)
    : path_(std::move(path)), what_(std::move(what)), sync_(sync) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    const int err = errno;
    if (err != ENOENT) fail(std::strerror(err));
    target_ = final_target(what_, path_).string();
    open_temporary(-1);
    return;
  }
  if (S_ISDIR(st.st_mode)) fail("it is a directory, expected a file name");
  // A device or a pipe is not a file to replace: replacing /dev/null with
  // a regular file (as root) would break the system, and a pipe's reader
  // waits on this very node.
  if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
    fd_ = Fd(::open(path_.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd_.valid()) fail(std::strerror(errno));
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    fail("it is a block device or a socket, expected a file, a character device or a FIFO");
  }
  target_ = final_target(what_, path_).string();
  open_temporary(static_cast<int>(st.st_mode & 0777));
}

void OutputFile::open_temporary(int mode) {
  static std::atomic<unsigned> counter{0};  // distinct names for the threads of this process
  const fs::path target = target_;
  for (int attempt = 0; attempt < kTemporaryAttempts && !fd_.valid(); ++attempt) {
    temp_ = (folder_of(target) / ("." + target.filename().string() + ".tmp." +
                                  std::to_string(::getpid()) + "." + std::to_string(counter++)))
                .string();
    // O_EXCL: never write into a file (or through a link) someone else made.
    fd_ = Fd(::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
    const int err = errno;
    if (!fd_.valid() && err != EEXIST) {
      temp_.clear();  // nothing of ours to remove
      fail(std::strerror(err) + (" (creating a temporary file in " + folder_of(target).string() + ")"));
    }
  }
  if (!fd_.valid()) {
    temp_.clear();
    fail("every temporary name tried in " + folder_of(target).string() + " exists");
  }
  if (mode >= 0 && ::fchmod(fd_.get(), static_cast<mode_t>(mode)) != 0) {
    const int err = errno;
    ::unlink(temp_.c_str());  // a constructor that throws runs no destructor
    temp_.clear();
    fail(std::string("cannot give the new file the old one's permissions: ") + std::strerror(err));
  }
}

OutputFile::~OutputFile() {
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void OutputFile::write(const void* data, size_t n) {
  if (const int err = write_all(fd_.get(), data, n)) fail(std::strerror(err));
}

void OutputFile::commit() {
  const bool replacing = !temp_.empty();
  const bool durable = sync_ == Sync::kDurable && replacing;
  // The data must be on disk before the rename publishes it, or a crash
  // could leave a complete-looking name over a torn file.
  if (durable && ::fsync(fd_.get()) != 0) {
    const int err = errno;
    fail(std::string("fsync failed: ") + std::strerror(err));
  }
  if (const int err = fd_.close()) fail(std::strerror(err));
  if (replacing && ::rename(temp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    fail("cannot rename " + temp_ + " over " + target_ + ": " + std::strerror(err));
  }
  committed_ = true;
  if (!durable) return;
  // Without it a crash can forget the new directory entry even though the
  // file's data is on disk.
  const std::string folder = folder_of(target_).string();
  const Fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid() || ::fsync(dir.get()) != 0) {
    const int err = errno;
    fail("written, but it may not survive a crash: fsync of the folder " + folder + " failed: " +
         std::strerror(err));
  }
}

void OutputFile::fail(const std::string& reason) const { fail_output(what_, path_, reason); }

void write_file_whole(const std::string& path, std::string_view text, const std::string& what) {
  OutputFile out(path, what);
  out.write(text);
  out.commit();
}

}  // namespace vtrain::common
