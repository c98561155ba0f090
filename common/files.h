// Output files: what a command writes to a path the user named (a plan, the
// Pareto fronts, a trace, a checkpoint, the metrics), written so that a
// failure never leaves a partial file and never replaces what is not a file.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace vtrain::common {

// An output cannot be written: a full disk, a directory at the path, no
// permission. A runtime failure (the command exits 1), not bad input: the
// message names what was written, the path and the reason
// ("cannot write plan out/p.yaml: No space left on device").
class OutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A POSIX file descriptor, closed on destruction unless close() was called.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close();
  }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) close();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // Closes now; returns 0 or the errno. A writer must check it: close() can
  // report a write error deferred by the file system (NFS does this).
  int close();

 private:
  int fd_ = -1;
};

// Writes all n bytes, resuming after short writes and EINTR. Returns 0 or
// the errno (ENOSPC when write() makes no progress).
int write_all(int fd, const void* data, size_t n);

// One output file, written whole or not at all. What is at `path` decides how:
//   nothing, or a regular file: the bytes go to a temporary file beside it
//     (".NAME.tmp.PID.N"), which commit() renames over it; a failure or a
//     destruction before commit() removes the temporary and leaves the old
//     file (or none). A replaced file keeps its permission bits.
//   a symbolic link (chain): the same for the file it ends at, which is
//     created if missing; the link itself stays.
//   a character device or FIFO (/dev/null, a terminal, a named pipe): written
//     in place, as a shell's `>` would; there is nothing to replace. A write
//     error (/dev/full) is reported like any other.
//   a directory, a block device or a socket: refused before anything is
//     written.
// Every failure throws OutputError "cannot write WHAT PATH: REASON".
class OutputFile {
 public:
  enum class Sync {
    kNone,     // a crash may lose the file (the old one stays until commit)
    kDurable,  // commit() fsyncs the data before the rename, then the directory
  };

  // Opens (creates) the file to write; `what` names it in errors ("plan").
  OutputFile(std::string path, std::string what, Sync sync = Sync::kNone);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Appends n bytes.
  void write(const void* data, size_t n);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Makes what was written the file at the path (see the class).
  void commit();

  const std::string& path() const { return path_; }

 private:
  // Opens temp_ beside target_; `mode`: the permission bits of the file it
  // replaces, or -1 for a new file.
  void open_temporary(int mode);
  [[noreturn]] void fail(const std::string& reason) const;

  std::string path_;
  std::string what_;
  Sync sync_;
  std::string target_;  // the file renamed over (symlinks resolved); empty when written in place
  std::string temp_;    // the temporary beside target_; empty when written in place
  Fd fd_;
  bool committed_ = false;
};

// `text` as the whole content of `path`, as OutputFile writes it (no fsync).
// Throws OutputError naming `what` ("plan", "Pareto fronts"), the path and
// the reason.
void write_file_whole(const std::string& path, std::string_view text, const std::string& what);

}  // namespace vtrain::common
