#include "common/text_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/files.h"
#include "common/input_error.h"
#include "common/text.h"

namespace vtrain::common {

std::string read_text_file(const std::string& path, const std::string& what, uint64_t limit) {
  const auto fail = [&](const char* action, const std::string& why) {
    return InputError(std::string("cannot ") + action + " " + what + " " + path + ": " + why);
  };
  const auto too_large = [&] {
    return fail("read", "larger than " + format_bytes(limit) + ", the most a " + what +
                            " may be (is it a " + what + "?)");
  };
  // O_NONBLOCK: opening a FIFO nobody writes to would otherwise wait for a
  // writer. Reads block again below, so a pipe's writer is waited for.
  Fd file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) throw fail("open", std::strerror(errno));
  struct stat info {};
  if (::fstat(file.get(), &info) != 0) throw fail("open", std::strerror(errno));
  if (S_ISDIR(info.st_mode)) throw fail("open", "is a directory");
  if (S_ISREG(info.st_mode) && static_cast<uint64_t>(info.st_size) > limit) throw too_large();
  const int flags = ::fcntl(file.get(), F_GETFL);
  if (flags < 0 || ::fcntl(file.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    throw fail("read", std::strerror(errno));
  }

  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(file.get(), buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw fail("read", std::strerror(errno));
    if (got == 0) return text;
    if (text.size() + static_cast<uint64_t>(got) > limit) throw too_large();
    text.append(buffer, static_cast<size_t>(got));
  }
}

}  // namespace vtrain::common
